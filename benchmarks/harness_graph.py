"""CUDA-graph replay vs eager: equality over N steps and the step time of each (GPU only).

Two copies of the toy model (tests/harness_toy.py) with LAMB + clipping train on the same batches,
one eagerly, one by replaying the captured full iteration; calls alternate (interleaved timing).

    python benchmarks/harness_graph.py [--steps 200] [--batch 256] [--hidden 1024]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--hidden", type=int, default=1024)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("no CUDA device: CUDA-graph capture cannot be measured on this machine")
        return 0
    from tests.harness_graph import compare

    out = compare(steps=args.steps, overrides=(f"model.hidden={args.hidden}",), batch=args.batch)
    print(f"device {torch.cuda.get_device_name()}: toy MLP hidden={args.hidden}, batch={args.batch}, "
          f"{out['steps']} steps")
    print(f"max |param diff| graph vs eager = {out['max_diff']:.3g}, max |loss diff| = {out['loss_diff']:.3g}")
    print(f"eager {out['eager_step_ms']:.3f} ms/step, graph {out['graph_step_ms']:.3f} ms/step, "
          f"speedup eager/graph = {out['eager_step_ms'] / out['graph_step_ms']:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
