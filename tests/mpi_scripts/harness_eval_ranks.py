"""Run under mpiexec: the toy workload with dedicated evaluation ranks (``train.eval_ranks``).

``run CLASS LOG OVERRIDES...``: one run of ``tests.harness_toy.CLASS``; the instance leader writes LOG.
``slow``: the evaluation ranks take 3 s per evaluation and the training ranks wait at most 1 s.
``fail``: the evaluation rank raises inside its evaluation.
``trainfail``: the training ranks cannot load their data (the evaluation rank must not wait for jobs).
Prints one JSON line per rank (the run's result, or the error it raised).
"""
from __future__ import annotations

import json
import sys
import time
from collections.abc import Mapping
from typing import Any

import torch

from hpcbench.common.dist import init_distributed
from hpcbench.common.errors import DataError, HpcbenchError
from hpcbench.common.mllog import MLPerfLogger
from hpcbench.common.system import SystemDescription
from hpcbench.common.trainer import Trainer
from tests import harness_toy


class SlowEval(harness_toy.ToyWorkload):
    """An evaluation that outlasts ``train.eval_timeout_s`` (a hung or overloaded evaluation rank)."""

    def eval_sums(self, outputs: torch.Tensor, batch: Any) -> Mapping[str, torch.Tensor]:
        time.sleep(3.0 / 16)  # 16 eval batches on one rank: 3 s
        return super().eval_sums(outputs, batch)


class FailingEval(harness_toy.ToyWorkload):
    def eval_sums(self, outputs: torch.Tensor, batch: Any) -> Mapping[str, torch.Tensor]:
        raise RuntimeError("evaluation blew up")


class NoTrainData(harness_toy.ToyWorkload):
    def train_loader(self, shard: Any) -> Any:
        raise DataError("no training files here")


def main() -> None:
    env = init_distributed(device="cpu")
    mode = sys.argv[1]
    if mode == "run":
        cls, log, overrides = getattr(harness_toy, sys.argv[2]), sys.argv[3], sys.argv[4:]
    else:
        cls, log = {"slow": SlowEval, "fail": FailingEval, "trainfail": NoTrainData}[mode], None
        overrides = ["train.eval_ranks=1", "train.max_epochs=1", "train.eval_timeout_s=1"]
    cfg = cls.load_config("mini", overrides)
    logger = MLPerfLogger(log if log and env.layout.instance_rank == 0 else None)
    t0 = time.perf_counter()
    try:
        r = Trainer(cls(cfg), env, logger, SystemDescription(), progress=False).run()
        row = {"status": r.status, "metrics": r.metrics, "epochs": r.epochs, "steps": r.steps,
               "tts": r.time_to_solution_s, "stop_ms": r.run_stop_ms}
    except HpcbenchError as exc:
        row = {"status": "error", "error": str(exc)}
    except RuntimeError as exc:  # the evaluation's own failure, on the evaluation rank
        row = {"status": "raised", "error": str(exc)}
    row["seconds"] = time.perf_counter() - t0
    logger.close()
    print(json.dumps({"rank": env.layout.world_rank, **row}), flush=True)
    env.close()


if __name__ == "__main__":
    main()
