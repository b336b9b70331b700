"""OpenFold (MLPerf HPC 3.0.0): AlphaFold2 in plain torch, trained from a pinned checkpoint to an average
lDDT-Ca target on CAMEO targets. ``BENCHMARK`` is its record. Data formats and features in ``data/`` (schema
``features.py``), the model, losses and checkpoint in ``model/``, the harness glue in ``workload.py``."""
from hpcbench.common.benchmark import Benchmark, ClosedDefinition, HyperparameterKeys, Target

#: sha256 of the reference's initial checkpoint (closed_openfold.yaml: init_checkpoint_sha256sum); the same
#: value as model/checkpoint.py's CLOSED_INIT_CHECKPOINT_SHA256, kept here so that the record stays light
INIT_CHECKPOINT_SHA256 = "b518be4677048f2c0f94889c91e2da73655a73b825a8aa7f8b6f5e580d8ffbed"

BENCHMARK = Benchmark(
    name="openfold", benchmark="openfold", suite="hpc", ruleset="3.0.0",
    target=Target("eval_accuracy", 0.8, 1.0, True, True),  # v['value'] >= 0.8 and v['value'] <= 1.0
    higher_is_better=True, required_runs=10, epoch_reporting="samples",
    # the reference evaluates when iteration % val_every_iters == 0 only (train.py): no evaluation off that grid
    closed_cadence_only=True,
    grad_accum_key="gradient_accumulation_steps",  # train.py: mllogger.constants.GRADIENT_ACCUMULATION_STEPS
    summary="AlphaFold2 (OpenFold) protein structure from sequence, MSA and templates, fine-tuned from a pinned "
            "checkpoint to an average lDDT-Ca",
    layout="layout", workload="workload:OpenFoldWorkload", datagen="datagen:OpenFoldDatagen",
    keys=HyperparameterKeys(
        {"adam": ("opt_name", "opt_base_learning_rate", "opt_adam_beta_1", "opt_adam_beta_2", "opt_adam_epsilon",
                  "opt_weight_decay", "opt_amsgrad", "opt_gradient_clipping", "opt_gradient_clip_norm",
                  "opt_learning_rate_warmup_init", "opt_learning_rate_warmup_steps", "swa_enabled",
                  "swa_decay_rate")},
        names={"adam": "Adam"}),
    closed=ClosedDefinition(
        parameters=(93_229_082,), train_samples=594_595, eval_samples=180,
        fixed={"opt_name": "Adam", "opt_adam_beta_1": 0.9, "opt_adam_beta_2": 0.999, "opt_adam_epsilon": 1e-6,
               "opt_weight_decay": 0.0, "opt_amsgrad": False, "opt_gradient_clipping": True,
               "opt_gradient_clip_norm": 0.1, "swa_enabled": True, "swa_decay_rate": 0.9,
               "init_checkpoint_sha256sum": INIT_CHECKPOINT_SHA256, "train_sequence_crop_size": 256,
               "num_recycling_iters": 3, "max_msa_clusters": 124, "max_extra_msa": 1024, "templates_enabled": True,
               "max_templates": 4, "val_every_iters": 40, "train_max_pdb_release_date": "2021-09-16",
               "val_min_cameo_submission_date": "2021-09-17", "val_max_cameo_submission_date": "2021-12-11",
               "val_max_sequence_length": 700, "fape_loss_weight": 1.0, "fape_loss_backbone_weight": 0.5,
               "fape_loss_sidechain_weight": 0.5, "supervised_chi_loss_weight": 1.0, "distogram_loss_weight": 0.3,
               "masked_msa_loss_weight": 2.0, "plddt_loss_weight": 0.01},
        source="hpc_3.0.0/closed_openfold.yaml (every fixed key, the 93,229,082 parameters, 594,595 training "
               "chains of PDB <= 2021-09-16, 180 CAMEO evaluation targets); reference train.py (Adam eps 1e-6, "
               "clipping 0.1, SWA)"),
)
