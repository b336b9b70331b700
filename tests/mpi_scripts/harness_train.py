"""Run under mpiexec (or alone): toy-workload runs that the harness tests compare.

``resume DIR``: a 4-epoch run, vs a 2-epoch run with checkpoints + a resumed run to epoch 4
(DistributedLAMB, so sharded optimizer state goes through the checkpoint). ``eval``: BatchNorm
statistics averaged over the ranks and the metric from summed statistics equal a one-process
evaluation of the same model. Prints one JSON line per rank.
"""
from __future__ import annotations

import json
import sys

import torch

from hpcbench.common.dist import init_distributed
from hpcbench.common.mllog import MLPerfLogger
from hpcbench.common.system import SystemDescription
from hpcbench.common.trainer import Trainer
from tests.harness_toy import ToyLoader, ToyWorkload, make_data


def trainer(env, overrides: list[str]) -> Trainer:  # noqa: ANN001
    cfg = ToyWorkload.load_config("mini", ["train.target=0.0", "train.global_batch_size=8", *overrides])
    return Trainer(ToyWorkload(cfg), env, MLPerfLogger(None), SystemDescription(), progress=False)


def resume(env, root: str) -> dict:  # noqa: ANN001
    common = ["optim.name=lamb", "optim.distributed=true", "optim.lr=0.01", "optim.weight_decay=0.01",
              f"train.checkpoint_dir={root}", "train.checkpoint_every=1", "train.eval_every=100"]
    full = trainer(env, [*common[:-3], "train.max_epochs=4"])
    res_full = full.run()
    first = trainer(env, [*common, "train.max_epochs=2"])
    first.run()
    second = trainer(env, [*common, "train.max_epochs=4", "train.resume=true"])
    res_second = second.run()
    return {
        "max_diff": (full.parts.flat.params - second.parts.flat.params).abs().max().item(),
        "moved": (full.parts.flat.params - first.parts.flat.params).abs().max().item(),
        "losses_full": res_full.epoch_losses, "losses_resumed": res_second.epoch_losses,
        "steps": [res_full.steps, res_second.steps], "metric": [res_full.final_metric, res_second.final_metric],
    }


def evaluate(env) -> dict:  # noqa: ANN001
    tr = trainer(env, ["train.max_epochs=1", "data.eval=130"])
    parts = tr.setup()
    model, rank = parts.model, parts.parallel.rank
    model.train()
    torch.manual_seed(10 + rank)  # different BatchNorm statistics on every rank
    with torch.no_grad():
        model(torch.randn(32, tr.cfg.data.features) * (1 + rank))
    bn = model[1]
    means = env.instance_comm.allgather(bn.running_mean.clone())
    value = tr.evaluate(1)
    expected_mean = torch.stack(means).mean(0)
    # the same model evaluated alone on the whole validation set
    x, y = make_data(tr.cfg.data, "eval")
    model.eval()
    with torch.no_grad():
        single = (model(x) - y).abs().mean().item()
    return {"metric": value, "single": single, "bn_diff": (bn.running_mean - expected_mean).abs().max().item()}


def main() -> None:
    env = init_distributed(device="cpu")  # CPU behaviour (gloo), also on a GPU node
    out = resume(env, sys.argv[2]) if sys.argv[1] == "resume" else evaluate(env)
    print(json.dumps({"rank": env.layout.instance_rank, **out}), flush=True)
    env.close()


if __name__ == "__main__":
    main()
