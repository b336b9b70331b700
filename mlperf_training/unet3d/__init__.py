"""3D U-Net (MLPerf Training ``unet3d``, training suite): the KiTS19 preprocessed on-disk format, its
synthetic generator (kidneys and tumours), the reference model, Dice + cross-entropy loss, sliding-window
evaluation and the workload spec (``workload.py``, presets in ``configs/``; see ``docs/unet3d.md``).
"""
import math

from hpcbench.common.benchmark import Benchmark, ClosedDefinition, HyperparameterKeys, Target, upper_bound_only
from hpcbench.common.cadence import ClosedEvalEpochs

# training 4.0.0: the newest training ruleset of the installed mlperf-logging that lists unet3d
BENCHMARK = Benchmark(
    name="unet3d", benchmark="unet3d", suite="training", ruleset="4.0.0",
    target=Target("eval_accuracy", 0.908, math.inf, True, True),  # v['value'] >= 0.908 (no upper bound)
    open_target=upper_bound_only("eval_accuracy", 1.0, inclusive=False),
    # 40 runs; the training summarizer's olympic mean drops the 4 fastest and 4 slowest
    higher_is_better=True, required_runs=40, dropped_runs=4,
    # epoch_num counts samples (epochs x 168 at a batch dividing 168): the training 4.0.0 RCPs are in samples
    # (rcps_unet3d.json: 396,480 = 2,360 epochs), as every v4.0 submitter's log (NVIDIA's first evaluation at
    # epoch_num 168,000); with epoch numbers the package checker's RCP test fails a converged closed run. The
    # rules' table still says "Epoch" and the retired reference logged epochs; the tools decide here.
    epoch_reporting="samples",
    summary="3D U-Net segmentation of kidneys and tumours in KiTS19 CT volumes; sliding-window mean Dice",
    layout="dataset", workload="workload:UNet3DWorkload", datagen="synth:UNet3DDatagen",
    # training_rules.adoc, evaluation frequency: from epoch CEILING(1000*168/samples_per_epoch), then every
    # CEILING(20*168/samples_per_epoch) epochs (global batch 2: 1000, 1020, ...); a run is non-converged when
    # the target is not met within CEILING(10000*168/samples_in_epoch) epochs (the UNET3D rules): max_epochs
    closed_eval=ClosedEvalEpochs(start=1000, every=20, dataset=168, limit=10000),
    keys=HyperparameterKeys({"sgd": (  # the reference's SGD: warmup and decay boundaries in epochs
        "opt_name", "opt_base_learning_rate", "opt_momentum", "opt_weight_decay",
        "opt_learning_rate_warmup_epochs", "opt_learning_rate_decay_boundary_epochs",
        "opt_learning_rate_decay_factor")}),
    closed=ClosedDefinition(
        parameters=(31_190_243,), train_samples=168, eval_samples=42,
        fixed={"opt_name": "sgd", "oversampling": 0.4, "training_input_shape": [128, 128, 128],
               "validation_input_shape": [128, 128, 128], "validation_overlap": 0.5},
        # training_rules.adoc, "Appendix: Examples of Compliant Optimizers": image segmentation (medical) lists MXNet's
        # mx.optimizer.NAG (SGD with Nesterov momentum) beside torch.optim.SGD; NVIDIA's MXNet unet3d logs it as 'nag'
        also_allowed={"opt_name": ("nag",)},
        source="training_rules.adoc (unet3d: sgd, or MXNet's NAG; oversampling, input shapes, overlap and data_train_samples fixed "
               "to the reference: 0.4, 128^3, 128^3, 0.5); training_4.0.0/closed_unet3d.yaml (168/42); the "
               "reference Unet3D(1, 3, instancenorm, relu): 31,190,243 parameters"),
)
