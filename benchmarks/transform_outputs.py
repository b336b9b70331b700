"""The CPU batch transforms into reused host outputs (``HostBuffers.output``; since 2026-11-25 also in
one pass of pieces, common/data/pointwise.py: the same values) against the torch formulas into a fresh
output per batch (the transforms before 2026-11-25), at full shapes: best wall ms per batch over
``--rounds`` (interleaved) and the page faults of the last call of each.

    python -m benchmarks.transform_outputs [--rounds 8] [--batch 4]
"""
from __future__ import annotations

import argparse
import resource
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from hpcbench.workloads.cosmoflow.dataset import CosmoFlowData
from hpcbench.workloads.deepcam.data import Normalizer
from hpcbench.workloads.deepcam.dataset import DeepCAMData

from benchmarks.machine import describe, header


def timed(fn: Callable[[Any], Any], batch: Any) -> tuple[float, int]:
    """(ms, minor page faults) of one call; its output is dropped before returning, as a step drops a batch."""
    f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    t = time.perf_counter()
    out = fn(batch)
    dt = time.perf_counter() - t
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0
    del out
    return 1e3 * dt, faults


def cases(b: int) -> dict[str, tuple[Any, Callable[[Any], Any], Callable[[Any], Any]]]:
    """name -> (batch, fresh-output transform, the spec's transform)."""
    g = torch.Generator().manual_seed(0)
    dc = DeepCAMData(list(range(16)), channels_last=True)
    dc._norm = Normalizer(np.zeros(16, np.float32), np.full(16, 0.5, np.float32))  # what open() reads from stats.h5
    shift, scale = dc._norm_tensors(torch.device("cpu"))
    dc_batch = (torch.rand(b, 768, 1152, 16, generator=g), torch.randint(0, 3, (b, 768, 1152), generator=g,
                                                                          dtype=torch.uint8))
    cf = CosmoFlowData(128, channels_last=True)
    cf_batch = (torch.randint(0, 300, (b, 128, 128, 128, 4), generator=g, dtype=torch.int16), torch.rand(b, 4))
    cf_first = CosmoFlowData(128, channels_last=False)  # NCDHW output: the layout change is part of the transform
    return {
        f"DeepCAM 768x1152x16 batch {b} (normalize + int64 labels)":
            (dc_batch, lambda t: ((t[0] - shift).mul_(scale).permute(0, 3, 1, 2), t[1].long()), dc.transform),
        f"CosmoFlow 128^3x4 batch {b} (float32 log1p)":
            (cf_batch, lambda t: (t[0].to(torch.float32).log1p_().permute(0, 4, 1, 2, 3), t[1]), cf.transform),
        f"CosmoFlow 128^3x4 batch {b} channels-first (float32 log1p, NCDHW)":
            (cf_batch, lambda t: (t[0].to(torch.float32).log1p_().permute(0, 4, 1, 2, 3).contiguous(), t[1]),
             cf_first.transform),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--batch", type=int, default=4)
    a = ap.parse_args()
    print(header(describe()), flush=True)
    print(f"# channels-last (the full presets) unless named; torch threads {torch.get_num_threads()}; best of {a.rounds} "
          f"interleaved rounds", flush=True)
    for name, (batch, fresh, reused) in cases(a.batch).items():
        for x, y in zip(fresh(batch), reused(batch)):
            assert torch.equal(x, y), name  # the same values, whichever output they are written into
        best = {"fresh": (float("inf"), 0), "reused": (float("inf"), 0)}
        for _ in range(a.rounds):
            for key, fn in (("fresh", fresh), ("reused", reused)):
                ms, faults = timed(fn, batch)
                best[key] = (min(best[key][0], ms), faults)
        (f_ms, f_pf), (r_ms, r_pf) = best["fresh"], best["reused"]
        print(f"{name}: fresh output {f_ms:7.1f} ms ({f_pf} page faults), reused output {r_ms:7.1f} ms "
              f"({r_pf} page faults): {f_ms / r_ms:.2f}x", flush=True)


if __name__ == "__main__":
    main()
