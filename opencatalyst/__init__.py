"""OpenCatalyst OC20 S2EF: DimeNet++ energies and forces (MLPerf HPC). ``BENCHMARK`` is its record."""
from hpcbench.common.benchmark import Benchmark, HyperparameterKeys, Target

BENCHMARK = Benchmark(
    name="oc20", benchmark="oc20", suite="hpc", ruleset="3.0.0",
    target=Target("eval_error", 0.0, 0.036, False, True),
    higher_is_better=False, required_runs=5,
    summary="DimeNet++ energies and forces of catalyst slabs with adsorbates (OC20 S2EF)",
    layout="layout", workload="workload:OC20Workload", converter="convert:convert",
    keys=HyperparameterKeys(  # the MLPerf rule: AdamW, warmup and multistep decay in steps
        {"adamw": ("opt_name", "opt_base_learning_rate", "opt_learning_rate_warmup_steps",
                   "opt_learning_rate_warmup_factor", "opt_learning_rate_decay_boundary_steps",
                   "opt_learning_rate_decay_factor")},
        names={"adamw": "AdamW"}),
)
