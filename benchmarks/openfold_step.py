"""OpenFold full-shape training step: one crop-256 sample with 124 MSA clusters, 1,024 extra sequences, 4
templates and 3 recycling iterations (the closed setup), forward (3 recycles without gradients, the last with
them) + the reference's loss + backward + Adam, eager and under ``torch.compile``, per second.

The sample comes from the real pipeline (``openfold_mlperf.data``) on a synthetic chain of 300 residues, cropped
to 256 and padded to the schema's sizes, so the shapes are the closed ones. The model is the closed one
(c_m 256, c_z 128, c_s 384, 8 structure-module layers, template stack, 4 extra-MSA blocks) with
``--evoformer-blocks`` of the 48 Evoformer blocks (default 48): a 2-core CPU cannot run 48 in a bounded budget,
so its committed result states the count it ran, and the full-stack time scales with it (the Evoformer is all
but a fixed part of the step). ``--budget-s`` bounds the run; what does not fit is skipped and said. On a GPU
the per-GPU rate is compared with NVIDIA's MLPerf HPC v3.0 OpenFold submission where it is given
(``--nvidia-steps-per-s``).

    python -m benchmarks.openfold_step --evoformer-blocks 2 --budget-s 600 --json out.json
"""
from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import torch

from benchmarks.budget import Budget, add_budget_argument, say
from benchmarks.machine import describe, header


def full_sample(crop: int, clusters: int, extra: int, templates: int, recycles: int) -> dict[str, torch.Tensor]:
    """One processed training sample of the closed shape, batch dimension added."""
    from hpcbench.workloads.openfold_mlperf.data import dataset, pipeline, store, synth

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        synth.generate_raw(root, synth.SynthConfig(families=1, members=3, min_length=crop + 44,
                                                   max_length=crop + 44, msa_rows=48, val_members=1))
        synth.preprocess(root, num_shards=1)
        rows = store.read_chains(root / "pdb_mmcif/processed/chains.csv")
        train = dataset.train_filter(rows, "2021-09-16")
        cfg = pipeline.PipelineConfig(crop_size=crop, max_msa_clusters=clusters, max_extra_msa=extra,
                                      max_templates=templates, num_recycling_iters=recycles)
        sample = dataset.ChainDataset(root, train, rows, cfg, "train")[(0, 1)]
    return {k: v.unsqueeze(0) for k, v in sample.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--crop", type=int, default=256)
    ap.add_argument("--clusters", type=int, default=124)
    ap.add_argument("--extra", type=int, default=1024)
    ap.add_argument("--templates", type=int, default=4)
    ap.add_argument("--recycles", type=int, default=3)
    ap.add_argument("--evoformer-blocks", type=int, default=48, help="of the closed model's 48 (full width)")
    ap.add_argument("--part", choices=("step", "evoformer"), default="step",
                    help="step: the whole training step; evoformer: only --evoformer-blocks full-width Evoformer "
                         "blocks, forward + backward on the closed shapes (MSA 124 clusters + 4 template rows, "
                         "256 residues), for a machine that cannot run a whole step in the budget")
    ap.add_argument("--modes", default="eager,compile", help="comma-separated: eager, compile")
    ap.add_argument("--repeats", type=int, default=3, help="timed steps per mode (at most)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=0,
                    help="torch threads (0: torch's default); 1 on a shared box, where spinning OpenMP threads of "
                         "several processes on few cores slow every step many times over")
    ap.add_argument("--nvidia-steps-per-s", type=float, default=0.0,
                    help="NVIDIA's per-GPU training steps/s of its v3.0 submission to compare with (0: none given)")
    ap.add_argument("--json", type=Path, default=None)
    add_budget_argument(ap, 600.0)
    args = ap.parse_args()
    budget = Budget(args.budget_s)
    if args.threads:
        torch.set_num_threads(args.threads)
    info = describe()
    say(header(info))
    from hpcbench.workloads.openfold_mlperf.model.alphafold import AlphaFold
    from hpcbench.workloads.openfold_mlperf.model.config import ModelConfig
    from hpcbench.workloads.openfold_mlperf.model.losses import alphafold_loss

    device = torch.device(args.device)
    closed = ModelConfig.closed()
    cfg = replace(closed, evoformer=replace(closed.evoformer, num_blocks=args.evoformer_blocks))
    results: dict[str, dict] = {}
    if args.part == "evoformer":
        evoformer_only(args, cfg, device, budget, results)
        finish(args, info, results, budget, device)
        return
    t0 = time.perf_counter()
    batch = {k: v.to(device) for k, v in full_sample(args.crop, args.clusters, args.extra, args.templates,
                                                      args.recycles).items()}
    say(f"sample: crop {args.crop}, {args.clusters} clusters, {args.extra} extra, {args.templates} templates, "
        f"{args.recycles} recycles (msa_feat {tuple(batch['msa_feat'].shape)}), built in {time.perf_counter() - t0:.1f} s")
    last = {k: v[..., -1] for k, v in batch.items()}

    def build(mode: str):  # noqa: ANN202
        torch.manual_seed(0)
        model = AlphaFold(cfg).to(device).train()
        opt = torch.optim.Adam(model.parameters(), lr=1e-3, eps=1e-6)
        fwd = torch.compile(model) if mode == "compile" else model

        def step() -> float:
            t = time.perf_counter()
            loss, _ = alphafold_loss(fwd(batch), last, cfg.loss)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 0.1)
            opt.step()
            if device.type == "cuda":
                torch.cuda.synchronize()
            return time.perf_counter() - t

        return step, sum(p.numel() for p in model.parameters())

    timed_modes(args, budget, results, build, f"{args.evoformer_blocks} Evoformer blocks")
    finish(args, info, results, budget, device)


def timed_modes(args: argparse.Namespace, budget: Budget, results: dict, build, label: str) -> None:  # noqa: ANN001
    """Time ``build()``'s step function (-> (step callable, parameters)) in each mode of ``args.modes``."""
    for mode in [m.strip() for m in args.modes.split(",") if m.strip()]:
        if budget.spent():
            budget.skip(f"mode {mode}")
            continue
        step, params = build(mode)
        say(f"{mode}: {params:,} parameters ({label}); first step (warm-up"
            + (", compilation" if mode == "compile" else "") + ") ...")
        first = step()
        say(f"{mode}: first step {first:.1f} s")
        times: list[float] = []
        for r in range(args.repeats):
            each = times[-1] if times else first
            if budget.left() < each:
                budget.skip(f"{mode} steps {r + 1}-{args.repeats} (one needs ~{each:.0f} s)")
                break
            times.append(step())
            say(f"{mode}: step {r + 1}: {times[-1]:.2f} s")
        med = statistics.median(times) if times else None
        results[mode] = {"first_step_s": round(first, 2), "steps_s": [round(t, 2) for t in times],
                         "median_s": None if med is None else round(med, 3),
                         "steps_per_s": None if med is None else round(1.0 / med, 4), "parameters": params}
        if med is not None:
            say(f"{mode}: median {med:.2f} s/step = {1 / med:.4f} steps/s")


def evoformer_only(args: argparse.Namespace, cfg, device: torch.device, budget: Budget, results: dict) -> None:  # noqa: ANN001
    """Forward + backward of the Evoformer blocks alone on the closed shapes (a training step's bulk)."""
    from hpcbench.workloads.openfold_mlperf.model.evoformer import EvoformerStack

    rows = args.clusters + args.templates  # the template angle rows join the MSA representation
    g = torch.Generator().manual_seed(0)
    m = torch.randn(1, rows, args.crop, cfg.evoformer.c_m, generator=g).to(device)
    z = torch.randn(1, args.crop, args.crop, cfg.evoformer.c_z, generator=g).to(device)
    msa_mask = torch.ones(1, rows, args.crop, device=device)
    pair_mask = torch.ones(1, args.crop, args.crop, device=device)
    say(f"Evoformer only: {args.evoformer_blocks} block(s) at full width, m {tuple(m.shape)}, z {tuple(z.shape)}")

    def build(mode: str):  # noqa: ANN202
        torch.manual_seed(0)
        stack = EvoformerStack(cfg.evoformer).to(device).train()
        fwd = torch.compile(stack) if mode == "compile" else stack

        def step() -> float:
            t = time.perf_counter()
            mo, zo, so = fwd(m, z, msa_mask, pair_mask, True)
            (mo.float().mean() + zo.float().mean() + so.float().mean()).backward()
            if device.type == "cuda":
                torch.cuda.synchronize()
            return time.perf_counter() - t

        return step, sum(p.numel() for p in stack.parameters())

    timed_modes(args, budget, results, build, f"{args.evoformer_blocks} Evoformer block(s)")


def finish(args: argparse.Namespace, info: dict, results: dict, budget: Budget, device: torch.device) -> None:
    if "eager" in results and "compile" in results and results["eager"]["median_s"] and results["compile"]["median_s"]:
        say(f"compile speedup: {results['eager']['median_s'] / results['compile']['median_s']:.2f}x")
    if args.nvidia_steps_per_s and results:
        best = max((r["steps_per_s"] or 0.0) for r in results.values())
        say(f"vs NVIDIA v3.0 per GPU ({args.nvidia_steps_per_s:g} steps/s): {best / args.nvidia_steps_per_s:.3f}x")
    elif device.type == "cpu":
        say("no GPU comparison: a CPU run (NVIDIA's v3.0 rate is per H100)")
    budget.done()
    if args.json:
        args.json.write_text(json.dumps({"machine": info, "args": {k: str(v) for k, v in vars(args).items()},
                                         "results": results, "budget": budget.summary()}, indent=1))


if __name__ == "__main__":
    main()
