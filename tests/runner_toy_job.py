"""Under mpiexec: the real runner (hpcbench.runner) with a stand-in for common.trainer.run_training
that logs like the harness and does one real gloo all-reduce per epoch. TOY_FAIL="instance:rank:epoch"
makes that rank raise mid-run; TOY_FAIL_EARLY="instance:rank" makes it raise before its instance's first
MPI collective (its peers then sit in an MPI barrier that never completes).

    mpiexec -n 4 python tests/runner_toy_job.py RESULTS INSTANCES
"""
from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass, asdict
from pathlib import Path

import torch
import torch.distributed as dist

from hpcbench.common.dist import init_distributed
from hpcbench.common.system import SystemDescription
from hpcbench.runner import RunnerOptions, run_instances


@dataclass
class ToyResult:
    status: str
    epochs: int
    final_metric: float
    metric_key: str = "eval_error"
    time_to_solution_s: float = 0.0
    samples_per_s: float = 0.0

    def to_dict(self) -> dict:
        return asdict(self)


def _match(var: str, *vals: int) -> bool:
    spec = os.environ.get(var)
    return spec is not None and tuple(int(x) for x in spec.split(":")) == vals


def toy_train(workload, env, log, system) -> ToyResult:  # noqa: ANN001
    lay = env.layout
    if _match("TOY_FAIL_EARLY", lay.instance, lay.instance_rank):
        raise RuntimeError("toy setup failure before the first collective")
    log.event("cache_clear", True)
    log.start("init_start")
    log.submission(SystemDescription(system_name=system.system_name, number_of_nodes=lay.nodes_per_instance), "cosmoflow", "open")
    seed = 1 + lay.instance
    for key, value in (("seed", seed), ("global_batch_size", 4), ("train_samples", 32), ("eval_samples", 8),
                       ("opt_name", "sgd"), ("opt_base_learning_rate", 0.01), ("opt_learning_rate_warmup_epochs", 0),
                       ("opt_learning_rate_warmup_factor", 1.0), ("opt_learning_rate_decay_boundary_epochs", [2]),
                       ("opt_learning_rate_decay_factor", 0.1)):
        log.event(key, value)
    env.instance_comm.Barrier()
    log.end("init_stop")
    t0 = time.time()
    log.start("run_start")
    err = 0.5
    for epoch in range(1, 4):
        log.start("epoch_start", metadata={"epoch_num": epoch})
        t = torch.ones(4) * (lay.instance_rank + 1)
        dist.all_reduce(t)  # the instance's own gloo group
        time.sleep(0.2)
        if _match("TOY_FAIL", lay.instance, lay.instance_rank, epoch):
            raise FloatingPointError("toy divergence: loss is nan")
        log.end("epoch_stop", metadata={"epoch_num": epoch})
        log.start("eval_start", metadata={"epoch_num": epoch})
        err = 0.3 / epoch
        log.event("eval_error", err, metadata={"epoch_num": epoch})
        log.end("eval_stop", metadata={"epoch_num": epoch})
    status = "success" if err <= 0.124 else "aborted"
    log.end("run_stop", metadata={"status": status})
    return ToyResult(status, 3, err, time_to_solution_s=time.time() - t0, samples_per_s=96 / (time.time() - t0))


def main() -> int:
    results, instances = Path(sys.argv[1]), int(sys.argv[2])
    env = init_distributed(instances, ranks_per_node=1, torch_backend="gloo", timeout_s=60, device="cpu")
    opts = RunnerOptions(results=results, system=SystemDescription(system_name="toybox"),
                         straggler_grace_s=float(os.environ.get("TOY_GRACE", "5")))
    summary = run_instances(env, "cosmoflow", lambda root: None, opts, train_fn=toy_train)
    return 0 if summary is None or all(s["status"] == "success" for s in summary) else 4


if __name__ == "__main__":
    sys.exit(main())
