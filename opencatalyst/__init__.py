"""OpenCatalyst OC20 S2EF: DimeNet++ energies and forces (MLPerf HPC). ``BENCHMARK`` is its record."""
from hpcbench.common.benchmark import Benchmark, ClosedDefinition, HyperparameterKeys, Target

BENCHMARK = Benchmark(
    name="oc20", benchmark="oc20", suite="hpc", ruleset="3.0.0",
    target=Target("eval_error", 0.0, 0.036, False, True),
    higher_is_better=False, required_runs=5,
    summary="DimeNet++ energies and forces of catalyst slabs with adsorbates (OC20 S2EF)",
    layout="layout", workload="workload:OC20Workload", datagen="datagen:OC20Datagen", converter="convert:convert",
    keys=HyperparameterKeys(  # the MLPerf rule: AdamW, warmup and multistep decay in steps
        {"adamw": ("opt_name", "opt_base_learning_rate", "opt_learning_rate_warmup_steps",
                   "opt_learning_rate_warmup_factor", "opt_learning_rate_decay_boundary_steps",
                   "opt_learning_rate_decay_factor")},
        names={"adamw": "AdamW"}),
    closed=ClosedDefinition(
        parameters=(1_810_182,), train_samples=2_000_000, eval_samples=999_866, fixed={"opt_name": "AdamW"},
        source="hpc_training_rules.adoc (opt_name AdamW); reference configs/mlperf_hpc.yml (S2EF 2M train split, "
               "all/val_id: 2,000,000 and 999,866 structures, the OC20 paper's counts; DimeNet++ hidden 192: "
               "1,810,182 parameters, as the reference's ocpmodels/models/dimenet_plus_plus.py: torch-geometric's "
               "1,809,414 plus the 4 x 192 biases of the output blocks' lin_up)"),
)
