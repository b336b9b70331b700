"""DeepCAM loader throughput vs training-step rate, measured in the same process, interleaved.

For each repeat: one timed pass of the workload's training loader over ``--batches`` batches (the
shared prefetching loader of ``common.data``: reader threads read and validate the HDF5 files and
collate normalizes; ``torch``) and, when DALI is installed, of the same reader feeding DeepCAM's DALI
graph (``dali``), then ``--batches`` timed training steps of the preset's optimized path (bf16 +
channels-last) on a batch from the same loader. Prints samples/s of each and the ratio loader / step
(goal >= 2x: the input pipeline must not be what limits training).

    python -m hpcbench datagen deepcam --out /tmp/dc --samples 64 --eval-samples 8
    python benchmarks/deepcam_loader.py --data /tmp/dc --batch 8 --batches 6 --repeats 3
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from common.step import prepare_batch
from common.workload import DataShard
from deepcam.workload import DeepCAMWorkload

from deepcam_step import build, time_steps  # noqa: E402 - sibling benchmark module


def loader_pass(loader, batches: int) -> tuple[float, int]:  # noqa: ANN001
    t0 = time.perf_counter()
    n = 0
    for i, (x, _) in enumerate(loader):
        n += x.shape[0]
        if i + 1 == batches:
            break
    return time.perf_counter() - t0, n


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", required=True)
    p.add_argument("--preset", default="mini")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--batches", type=int, default=6)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=None, help="reader threads (default: the preset's)")
    a = p.parse_args()
    overrides = [f"data.root={a.data}", "train.channels_last=true"]
    if a.threads:
        overrides.append(f"data.threads={a.threads}")
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    shard = DataShard(rank=0, size=1, seed=1, local_batch_size=a.batch, device=device)
    loaders = {"torch": DeepCAMWorkload(DeepCAMWorkload.load_config(a.preset, overrides)).train_loader(shard)}
    try:
        import nvidia.dali  # noqa: F401

        dali_cfg = DeepCAMWorkload.load_config(a.preset, overrides + ["train.loader=dali"])
        loaders["dali"] = DeepCAMWorkload(dali_cfg).train_loader(shard)
    except ImportError:
        pass
    wl = DeepCAMWorkload(DeepCAMWorkload.load_config(a.preset, overrides))
    step = build(wl, "bf16", True, "eager", device)
    batch = prepare_batch(next(iter(loaders["torch"])), device, channels_last=True)
    time_steps(step, batch, 1, device)
    rates: dict[str, list[float]] = {k: [] for k in [*loaders, "step"]}
    for r in range(a.repeats):
        for name, loader in loaders.items():
            loader.set_epoch(r + 1)  # new shuffle: files not just read in this order
            seconds, n = loader_pass(loader, a.batches)
            rates[name].append(n / seconds)
        rates["step"].append(a.batch / time_steps(step, batch, a.batches, device))
    print(f"device={device} torch_threads={torch.get_num_threads()} reader_threads={wl.cfg.data.threads} "
          f"batch={a.batch} batches/pass={a.batches} repeats={a.repeats}")
    step_rate = statistics.median(rates["step"])
    print(f"training step (bf16, channels-last): {step_rate:8.2f} samples/s")
    for name in loaders:
        rate = statistics.median(rates[name])
        print(f"{name:8s} loader: {rate:8.2f} samples/s = {rate / step_rate:6.2f}x the step rate (goal >= 2x)")


if __name__ == "__main__":
    main()
