"""Llama 3.1 training speed: tokens/s and model FLOPs utilisation (MFU) of a training step.

Two shapes of :class:`hpcbench.workloads.mlperf_training.llama31_8b.model.Llama`:

* ``mini``: the ``mini`` preset's model (2 layers, width 64, vocabulary 512) at its sequence 128;
* ``8b``: a few layers of the full width (hidden 4096, feed-forward 14336, 32 query / 8 key-value heads,
  RoPE as the 8B) with the 8B's vocabulary where memory allows (``--wide-*``; on a CPU the defaults cut the
  layers, sequence and vocabulary to what a small box holds, and the output says so).

Variants: ``eager``; ``compile`` (``torch.compile`` of the model); on a GPU also ``cudagraphs`` (the whole
step - forward, backward and a capturable AdamW - captured once in a CUDA graph and replayed) and ``fp8``
(torchao's float8 training on every block linear, compiled) where ``torchao.float8`` is importable and the
GPU has compute capability >= 8.9; otherwise each is skipped with its reason. A step is forward (autocast
to bf16 where bf16 is native, else fp32, master weights fp32), next-token cross entropy, backward and an
AdamW step.

Model FLOPs per token (PaLM appendix B's convention, as MFU is usually reported): ``6 N + 12 L d S``: N the
weights of the matrix products (every linear, the output projection included; the embedding table is a
lookup), L layers, d the attention width (heads x head size), S the sequence; the attention term counts the
full S x S score and value products although causal attention needs about half. MFU = achieved model
FLOP/s / the peak of a square GEMM in the same dtype measured in the same run
(:func:`benchmarks.machine.matmul_peak`). Each variant runs ``--warmup`` untimed steps (compilation or
capture included, timed apart) and up to ``--steps`` timed ones; the median step is reported (the best too).

    python -m benchmarks.llama_mfu [--shapes mini,8b] [--variants eager,compile,cudagraphs,fp8] [--budget-s 900]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import torch
from torch import nn

from hpcbench.common.atomic import atomic_write_text
from hpcbench.workloads.mlperf_training.llama31_8b.model import LLAMA31_8B, Llama, LlamaConfig, token_nll_sum

from benchmarks.budget import Budget, add_budget_argument, say
from benchmarks.machine import bf16_native, describe, header, matmul_peak

VARIANTS = ("eager", "compile", "cudagraphs", "fp8")
GOAL_MFU = 0.45  # issue 27: >= 45% MFU at 8B-shaped layers in bf16 on an H100
MINI = LlamaConfig(vocab_size=512, dim=64, layers=2, heads=4, kv_heads=2, ffn_dim=192)
MINI_SEQ, MINI_BATCH = 128, 16


@dataclass(frozen=True)
class Shape:
    name: str
    cfg: LlamaConfig
    seq: int
    batch: int
    note: str = ""

    def matmul_weights(self) -> int:
        c = self.cfg
        kv = c.kv_heads * c.head_dim
        per_layer = 2 * c.dim * c.heads * c.head_dim + 2 * c.dim * kv + 3 * c.dim * c.ffn_dim
        return c.layers * per_layer + c.dim * c.vocab_size

    def flops_per_token(self) -> float:
        c = self.cfg
        return 6.0 * self.matmul_weights() + 12.0 * c.layers * c.heads * c.head_dim * self.seq


def flops_per_token(cfg: LlamaConfig, seq: int) -> float:
    """``6 N + 12 L d S`` for ``cfg`` at sequence ``seq`` (see the module docstring)."""
    return Shape("", cfg, seq, 1).flops_per_token()


def shapes(args: argparse.Namespace, cuda: bool) -> list[Shape]:
    out = []
    for name in args.shapes.split(","):
        if name == "mini":
            out.append(Shape("mini", MINI, MINI_SEQ, MINI_BATCH, "the mini preset's model"))
        elif name == "8b":
            layers = args.wide_layers or (4 if cuda else 1)
            seq = args.wide_seq or (8192 if cuda else 256)
            vocab = args.wide_vocab or (LLAMA31_8B.vocab_size if cuda else 16384)
            cfg = replace(LLAMA31_8B, layers=layers, vocab_size=vocab)
            note = f"{layers} of the 8B's 32 layers at full width, sequence {seq}"
            if vocab != LLAMA31_8B.vocab_size:
                note += f", vocabulary {vocab} instead of {LLAMA31_8B.vocab_size} (memory of this box)"
            out.append(Shape("8b", cfg, seq, args.wide_batch, note))
        else:
            raise SystemExit(f"--shapes: unknown shape {name!r} (mini, 8b)")
    return out


def why_not(variant: str, device: torch.device) -> str | None:
    """None if ``variant`` can run here, else the reason it is skipped."""
    if variant in ("cudagraphs", "fp8") and device.type != "cuda":
        return "needs a CUDA GPU"
    if variant == "fp8":
        try:
            from torchao.float8 import convert_to_float8_training  # noqa: F401 - importable is the question
        except ImportError as e:
            return f"torchao's float8 training is not importable ({e})"
        if torch.cuda.get_device_capability(device) < (8, 9):
            return f"float8 matmuls need compute capability >= 8.9, this GPU has {torch.cuda.get_device_capability(device)}"
    return None


class Runner:
    """One shape in one variant: the model, its AdamW, a fixed batch, and ``step()``."""

    def __init__(self, shape: Shape, variant: str, device: torch.device, dtype: torch.dtype, seed: int) -> None:
        torch.manual_seed(seed)
        self.device, self.dtype, self.variant = device, dtype, variant
        with torch.device(device):  # storage on the device; the values drawn on the CPU (Llama.init_weights)
            model: nn.Module = Llama(shape.cfg)
        cuda = device.type == "cuda"
        if variant == "fp8":  # before the optimizer: the swapped modules' parameters are the ones it steps
            from torchao.float8 import convert_to_float8_training

            convert_to_float8_training(model, module_filter_fn=lambda mod, fqn: fqn != "output" and isinstance(
                mod, nn.Linear) and mod.in_features % 16 == 0 and mod.out_features % 16 == 0)
        self.opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.95), eps=1e-5, weight_decay=0.1,
                                     fused=cuda or None, capturable=variant == "cudagraphs")
        if variant in ("compile", "fp8"):
            model = torch.compile(model)
        self.model = model
        gen = torch.Generator().manual_seed(seed + 1)
        self.tokens = torch.randint(0, shape.cfg.vocab_size, (shape.batch, shape.seq + 1), generator=gen).to(device)
        self.graph: Any = None

    def _step(self) -> torch.Tensor:
        x, y = self.tokens[:, :-1], self.tokens[:, 1:]
        # the cache of cast weights cannot live across a CUDA graph capture
        with torch.autocast(self.device.type, dtype=self.dtype, enabled=self.dtype != torch.float32,
                            cache_enabled=self.variant != "cudagraphs"):
            logits = self.model(x)
        loss = token_nll_sum(logits, y) / y.numel()
        loss.backward()
        self.opt.step()
        return loss.detach()

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def warm(self) -> None:
        """The first step(s): compilation, or the CUDA graph's warm-up on a side stream and its capture."""
        if self.variant != "cudagraphs":
            self.opt.zero_grad(set_to_none=True)
            self._step()
            self.sync()
            return
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            for _ in range(3):
                self.opt.zero_grad(set_to_none=True)
                self._step()
        torch.cuda.current_stream(self.device).wait_stream(side)
        # gradients set to None before the capture: the captured backward allocates them from the graph's pool and
        # each replay writes them afresh (PyTorch's whole-network capture recipe), so no zeroing between replays
        self.opt.zero_grad(set_to_none=True)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.loss = self._step()
        self.sync()

    def step(self) -> float:
        self.sync()
        t = time.perf_counter()
        if self.graph is not None:
            self.graph.replay()
        else:
            self.opt.zero_grad(set_to_none=True)
            self._step()
        self.sync()
        return time.perf_counter() - t


def measure(shape: Shape, variant: str, device: torch.device, dtype: torch.dtype, peak: float, args: argparse.Namespace,
            budget: Budget) -> dict[str, Any]:
    runner = Runner(shape, variant, device, dtype, args.seed)
    t0 = time.perf_counter()
    runner.warm()
    for _ in range(args.warmup - 1):
        runner.step()
    warm_s = time.perf_counter() - t0
    times = [runner.step()]
    for _ in range(budget.fit(times[0], args.steps - 1, share=args.share)):
        if len(times) >= args.steps:
            break
        times.append(runner.step())
    med, best = statistics.median(times), min(times)
    tokens = shape.batch * shape.seq
    fpt = shape.flops_per_token()
    res = {"variant": variant, "steps_timed": len(times), "warmup_s": round(warm_s, 2), "step_s_median": med,
           "step_s_best": best, "tokens_per_s": tokens / med, "model_flops_per_s": fpt * tokens / med,
           "mfu": fpt * tokens / med / peak, "mfu_best_step": fpt * tokens / best / peak}
    del runner
    torch._dynamo.reset()  # the compiled variants' graphs go with their model
    if device.type == "cuda":
        res["max_memory_gib"] = torch.cuda.max_memory_allocated(device) / 2**30
        torch.cuda.reset_peak_memory_stats(device)
        torch.cuda.empty_cache()
    return res


def row(shape: Shape, r: dict[str, Any]) -> str:
    mem = f", {r['max_memory_gib']:.1f} GiB" if "max_memory_gib" in r else ""
    return (f"  {shape.name:4s} {r['variant']:10s} {r['tokens_per_s']:12,.0f} tokens/s  step {r['step_s_median'] * 1e3:9.1f} ms "
            f"(median of {r['steps_timed']}, best {r['step_s_best'] * 1e3:.1f})  {r['model_flops_per_s'] / 1e12:8.3f} TFLOP/s  "
            f"MFU {100 * r['mfu']:5.1f}% (best step {100 * r['mfu_best_step']:.1f}%)  warm-up {r['warmup_s']:.1f} s{mem}")


def goal_line(results: dict[str, dict[str, dict[str, Any]]], device: torch.device, dtype: torch.dtype) -> str:
    what = f"H100 goal: >= {GOAL_MFU:.0%} MFU at 8B-shaped layers in bf16"
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else ""
    measured = {v: r["mfu"] for v, r in results.get("8b", {}).items() if v in ("eager", "compile", "cudagraphs")}
    if "H100" not in name or dtype != torch.bfloat16 or not measured:
        why = "no GPU" if device.type != "cuda" else f"device is {name}" if "H100" not in name else "no bf16 8b run"
        return f"{what}: not measured here ({why})"
    best = max(measured, key=measured.get)  # type: ignore[arg-type]
    return f"{what}: best {100 * measured[best]:.1f}% ({best}) - {'met' if measured[best] >= GOAL_MFU else 'NOT met'}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="mini,8b", help="comma list of mini, 8b")
    ap.add_argument("--variants", default=",".join(VARIANTS), help="comma list of " + ", ".join(VARIANTS))
    ap.add_argument("--wide-layers", type=int, default=0, help="8b shape: layers (default 4 on a GPU, 1 on a CPU)")
    ap.add_argument("--wide-seq", type=int, default=0, help="8b shape: sequence (default 8192 on a GPU, 256 on a CPU)")
    ap.add_argument("--wide-vocab", type=int, default=0, help="8b shape: vocabulary (default 128256 on a GPU, 16384 on a CPU)")
    ap.add_argument("--wide-batch", type=int, default=1, help="8b shape: sequences per step")
    ap.add_argument("--device", default="auto", help="auto (cuda if available), cpu or cuda")
    ap.add_argument("--steps", type=int, default=10, help="timed steps per variant (at most)")
    ap.add_argument("--warmup", type=int, default=2, help="untimed steps per variant (the first compiles/captures)")
    ap.add_argument("--share", type=float, default=0.15, help="share of the time left one variant's timed steps may take")
    ap.add_argument("--peak-s", type=float, default=2.0, help="seconds for the GEMM peak")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (default: 1 on a CPU - on a shared box two "
                    "OpenMP threads under load wait on each other, steps 20x slower - and torch's choice on a GPU)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=Path, default=None, help="also write the results here")
    add_budget_argument(ap, 900.0)
    args = ap.parse_args()
    budget = Budget(args.budget_s)
    device = torch.device("cuda" if args.device == "auto" and torch.cuda.is_available() else
                          "cpu" if args.device == "auto" else args.device)
    if args.threads > 0 or device.type == "cpu":
        torch.set_num_threads(args.threads or 1)  # the peak and the steps with the same threads
    info = describe()
    say(header(info))
    native, why = bf16_native(device)
    dtype = torch.bfloat16 if native else torch.float32
    if device.type == "cuda":
        say(f"# device {torch.cuda.get_device_name(device)}; torch {torch.__version__}")
    say(f"# compute dtype {str(dtype).removeprefix('torch.')} ({why}); torch {torch.__version__}")
    variants = [v for v in args.variants.split(",") if v]
    for v in variants:
        if v not in VARIANTS:
            raise SystemExit(f"--variants: unknown variant {v!r} ({', '.join(VARIANTS)})")
    matmul_peak(dtype, seconds=0.2, max_n=512, device=device)  # first products pay the libraries' set-up
    peak, n = matmul_peak(dtype, seconds=args.peak_s, max_n=8192 if device.type == "cuda" else 2048, device=device)
    say(f"measured {str(dtype).removeprefix('torch.')} matmul peak: {peak / 1e12:.3f} TFLOP/s (n = {n})")
    results: dict[str, dict[str, dict[str, Any]]] = {}
    skipped: dict[str, str] = {}
    for shape in shapes(args, device.type == "cuda"):
        say(f"{shape.name}: {shape.note}; batch {shape.batch} x {shape.seq} tokens; {shape.matmul_weights():,} matmul "
            f"weights; {shape.flops_per_token():.4g} FLOP/token (6N {6 * shape.matmul_weights():.4g} + "
            f"attention {shape.flops_per_token() - 6 * shape.matmul_weights():.4g})")
        results[shape.name] = {}
        for v in variants:
            reason = why_not(v, device)
            if reason is not None:
                skipped[f"{shape.name}/{v}"] = reason
                say(f"  {shape.name:4s} {v:10s} skipped: {reason}")
                continue
            if budget.spent():
                budget.skip(f"{shape.name}/{v}")
                continue
            try:
                r = measure(shape, v, device, dtype, peak, args, budget)
            except torch.OutOfMemoryError as e:
                skipped[f"{shape.name}/{v}"] = f"out of memory ({str(e).splitlines()[0]})"
                say(f"  {shape.name:4s} {v:10s} skipped: out of memory")
                torch.cuda.empty_cache()
                continue
            results[shape.name][v] = r
            say(row(shape, r))
        if "eager" in results[shape.name]:
            base = results[shape.name]["eager"]["tokens_per_s"]
            say(f"  {shape.name} speed-up over eager: " + ", ".join(
                f"{v} {r['tokens_per_s'] / base:.2f}x" for v, r in results[shape.name].items() if v != "eager"))
    say(goal_line(results, device, dtype))
    say(f"# load at the end: {os.getloadavg()[0]:.2f} (1 min) on {os.cpu_count()} cores")
    if args.json is not None:
        atomic_write_text(args.json, json.dumps({
            "machine": info, "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
            "dtype": str(dtype).removeprefix("torch."), "peak_flops": peak, "peak_n": n,
            "shapes": {s.name: {**asdict(s.cfg), "seq": s.seq, "batch": s.batch, "note": s.note,
                                "matmul_weights": s.matmul_weights(), "flops_per_token": s.flops_per_token()}
                       for s in shapes(args, device.type == "cuda")},
            "results": results, "skipped": skipped, "goal": goal_line(results, device, dtype),
            "budget": budget.summary()}, indent=1) + "\n")
    budget.done()


if __name__ == "__main__":
    main()
