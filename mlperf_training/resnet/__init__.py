"""MLPerf Training ResNet-50 v1.5, registered as workload ``resnet`` of the training suite (ruleset
training 4.0.0): the ImageNet folder layout, a synthetic image generator, Pillow and DALI loaders with
the reference augmentation and a decoded-image cache, and the workload on the shared harness. See
docs/resnet.md.
"""
from hpcbench.common.benchmark import Benchmark, ClosedDefinition, HyperparameterKeys, Target, upper_bound_only

_POLY = ("opt_base_learning_rate", "opt_end_learning_rate", "opt_learning_rate_decay_poly_power",
         "opt_learning_rate_decay_steps", "opt_weight_decay", "opt_momentum")

# training 4.0.0: the newest training ruleset of the installed mlperf-logging that lists resnet.
# closed_resnet.yaml requires opt_name in {sgd, lars} and enqueues closed_resnet_<opt_name>.yaml, whose
# keys are the optimizer's name before opt_* (hparams.py adds model_bn_span, for every optimizer)
BENCHMARK = Benchmark(
    name="resnet", benchmark="resnet", suite="training", ruleset="4.0.0",
    target=Target("eval_accuracy", 0.759, 1.0, True, False),  # v['value'] >= 0.7590 and v['value'] < 1.0
    open_target=upper_bound_only("eval_accuracy", 1.0, inclusive=False),
    higher_is_better=True, required_runs=5,
    summary="ResNet-50 v1.5 image classification on ImageNet JPEG folders; top-1; LARS; Pillow or DALI loaders",
    layout="dataset", workload="workload:ResNetWorkload", datagen="synth:ResNetDatagen",
    # training_rules.adoc: "Every 4 epochs with offset 0 or 1 or 2 or 3"; no evaluation off that cadence
    closed_cadence_only=True,
    keys=HyperparameterKeys({
        "lars": ("opt_name", *(f"lars_{k}" for k in _POLY), "lars_epsilon", "lars_opt_learning_rate_warmup_epochs"),
        "sgd": ("opt_name", *(f"sgd_{k}" for k in _POLY), "opt_learning_rate_warmup_epochs"),
    }),
    closed=ClosedDefinition(
        parameters=(25_557_032,), train_samples=1_281_167, eval_samples=50_000,
        fixed_by_optimizer={
            "lars": {"lars_opt_end_learning_rate": 0.0001, "lars_opt_learning_rate_decay_poly_power": 2,
                     "lars_epsilon": 0.0},
            "sgd": {"sgd_opt_end_learning_rate": 0.0001, "sgd_opt_learning_rate_decay_poly_power": 2,
                    "sgd_opt_momentum": 0.9}},
        source="training_rules.adoc (resnet lars/sgd rows); training_4.0.0/closed_resnet_{lars,sgd}.yaml; "
               "ImageNet-1k: 1,281,167 training and 50,000 validation images; ResNet-50 v1.5: 25,557,032 parameters"),
)
