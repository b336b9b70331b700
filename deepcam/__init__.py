"""DeepCAM: segmentation of extreme weather in climate simulations (MLPerf HPC). ``BENCHMARK`` is its record."""
from hpcbench.common.benchmark import Benchmark, ClosedDefinition, HyperparameterKeys, Target

_ADAM = ("opt_name", "opt_lr", "opt_betas", "opt_eps", "opt_weight_decay", "scheduler_type",
         "scheduler_lr_warmup_steps", "scheduler_lr_warmup_factor")

BENCHMARK = Benchmark(
    name="deepcam", benchmark="deepcam", suite="hpc", ruleset="3.0.0",
    target=Target("eval_accuracy", 0.82, 1.0, True, True),
    higher_is_better=True, required_runs=5,
    summary="DeepLabv3+ segmentation of cyclones and atmospheric rivers in climate fields",
    layout="layout", workload="workload:DeepCAMWorkload", datagen="datagen:DeepCAMDatagen",
    keys=HyperparameterKeys(
        {"lamb": (*_ADAM, "opt_bias_correction", "opt_grad_averaging", "opt_max_grad_norm"),
         "adam": _ADAM, "adamw": _ADAM, "sgd": _ADAM},
        by_schedule={"multistep": ("scheduler_milestones", "scheduler_decay_rate"),
                     "cosine": ("scheduler_t_max", "scheduler_eta_min")},
        names={"lamb": "LAMB", "adam": "Adam", "adamw": "AdamW", "sgd": "SGD"}),
    closed=ClosedDefinition(
        parameters=(56_454_720,), train_samples=121_266, eval_samples=15_158, fixed={"opt_eps": 1e-6},
        source="hpc_training_rules.adoc (opt_eps 1e-6); hpc_3.0.0/closed_deepcam.yaml (train_samples 121266, "
               "eval_samples 15158); the reference DeepLabv3+/Xception: 56,454,720 parameters"),
)
