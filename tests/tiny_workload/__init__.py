"""A whole workload inside one test package (docs/adding-a-workload.md): its record here, its file format,
spec and synthetic data in ``dataset.py``, its model in ``model.py``, the workload in ``workload.py`` and its
preset in ``configs/mini.toml``. Nothing outside this folder names it: ``hpcbench`` runs it by its import
name (``hpcbench train tests.tiny_workload.workload:TinyWorkload``).

It regresses 4 numbers from 12 features stored one sample per ``.npy`` file; it claims the MLPerf benchmark
``cosmoflow`` (4 regression targets, ``eval_error`` = mean absolute error, SGD keys) so that the official
compliance checker applies that benchmark's open-division rules to its logs.
"""
from hpcbench.common.benchmark import Benchmark, HyperparameterKeys, Target

BENCHMARK = Benchmark(
    name="tiny", benchmark="cosmoflow", suite="hpc", ruleset="3.0.0",
    target=Target("eval_error", 0.0, 0.124, False, True),  # the checker's bound for cosmoflow
    higher_is_better=False, required_runs=10,
    summary="a 12-feature regression stored as .npy files (the test of the workload contract)",
    layout="dataset", workload="workload:TinyWorkload",
    keys=HyperparameterKeys({"sgd": (
        "opt_name", "opt_base_learning_rate", "opt_momentum", "opt_learning_rate_warmup_epochs",
        "opt_learning_rate_warmup_factor", "opt_learning_rate_decay_boundary_epochs",
        "opt_learning_rate_decay_factor", "opt_weight_decay")}),
)
