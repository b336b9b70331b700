"""What sharded reads + Allgatherv buy, by the staging model (``hpcbench.staging.model``), and which
parameters the published CosmoFlow staging times imply.

    python -m benchmarks.staging_model [--out benchmarks/results/staging_model_DATE]

No data and no measurement: it evaluates the model's formulas (the same ones ``hpcbench stage --dry-run``
prints) on CosmoFlow's published size and prints

1. each published weak-scaling staging time (NVIDIA: MLPerf HPC v1.0 and v2.0 on Selene from the v2.0
   write-up, v3.0 on Eos from its result logs' ``staging_duration``) with the one parameter it pins
   (the method's bottleneck) and what the other methods would take with that parameter;
2. the three methods' predicted time against the shared-filesystem bandwidth B and the instance count K,
   and the crossover bandwidth ``B* = K P / t_local`` below which reading every instance's packed copy
   (``independent``) is slower than sharded reads (``packed``), by ``K P / (B t_local)``;

and writes the plot (``OUT.png``) and the text (``OUT.txt``). A published point fixes one parameter;
it does not test the model's phase mix (docs/staging.md says what was validated and on what).
"""
from __future__ import annotations

import argparse
import datetime
from dataclasses import dataclass
from pathlib import Path

from hpcbench import registry
from hpcbench.staging.model import GB, METHODS, Layout, System, predict

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Published:
    label: str
    instances: int
    nodes_per_instance: int
    seconds: float
    method: str  # what the submission did, in the model's terms
    source: str


POINTS = [
    # v1.0: each of 32 instances (16 nodes) loaded its ~9 TB of small raw files from Lustre: 10.76 min
    Published("v1.0 Selene A100", 32, 16, 10.76 * 60, "copy", "NVIDIA MLPerf HPC v2.0 write-up (source document 003)"),
    # v2.0: data packed to ~15%, each node reads 1/N, MPI_Allgather to the nodes that need it: 6.7 min
    Published("v2.0 Selene A100", 128, 4, 6.7 * 60, "packed", "NVIDIA MLPerf HPC v2.0 write-up (source document 003)"),
    # v3.0: mlcommons/hpc_results_v3.0 NVIDIA/results/eos_n256_ngc23.09_pytorch/weak/cosmoflow/result_0.txt:
    # staging_stop metadata staging_duration = 269.454 s (64 instances x 4 DGX H100)
    Published("v3.0 Eos H100", 64, 4, 269.454, "packed", "hpc_results_v3.0 NVIDIA eos_n256 weak cosmoflow result_0.txt"),
]


def cosmoflow_size() -> tuple[float, float]:
    """(raw, packed) bytes of one instance's CosmoFlow data (train + validation), as the dry run uses."""
    known = registry.layout("cosmoflow").known
    raw = sum(k.files * k.raw_bytes_per_file for k in known.values())
    packed = sum(k.files * k.raw_bytes_per_file * k.compression_ratio for k in known.values())
    return float(raw), float(packed)


def implied(p: Published, raw: float, packed: float) -> tuple[str, float]:
    """The parameter the published time pins when the method's bottleneck takes all of it."""
    if p.method == "copy":  # K instances read their raw copies through the shared FS
        return "shared FS bandwidth (GB/s, all readers)", p.instances * raw / p.seconds / GB
    # packed: the FS reads P once (seconds at any plausible bandwidth); each node writes R/n
    return "node-local rate (GB/s per node: write, or decompress + fabric)", raw / p.nodes_per_instance / p.seconds / GB


def system(fs: float, local: float) -> System:
    """A cluster node with one local rate ``local`` for write (decompression and fabric faster: 4x), FS ``fs``."""
    return System(fs_GBps=fs, fabric_GBps=4 * local, write_GBps=local, decompress_GBps=4 * local)


def total(raw: float, packed: float, k: int, n: int, sys_: System, method: str) -> float:
    return predict(raw, packed, Layout(k * n, k), sys_, method).total_s


def report(raw: float, packed: float) -> tuple[list[str], dict[str, float]]:
    lines = [f"CosmoFlow per instance: {raw / 1e12:.2f} TB raw, {packed / 1e12:.2f} TB packed "
             f"({packed / raw:.0%}); model: hpcbench.staging.model (perfect pipelining)", "",
             "1. published weak-scaling staging times and the parameter each one pins", "",
             f"{'point':<18} {'K x n':>8} {'time s':>8} {'as':>7}  {'pins':<60} {'value':>8}"]
    pins: dict[str, float] = {}
    for p in POINTS:
        what, value = implied(p, raw, packed)
        pins[p.label] = value
        lines.append(f"{p.label:<18} {p.instances:>3} x {p.nodes_per_instance:<3} {p.seconds:>8.0f} {p.method:>7}  "
                     f"{what:<60} {value:>8.1f}")
    lines += ["", "   sources: " + "; ".join(f"{p.label}: {p.source}" for p in POINTS), ""]
    # what the other methods take with each point's pinned parameter (the rest generous)
    v1, v2, v3 = pins["v1.0 Selene A100"], pins["v2.0 Selene A100"], pins["v3.0 Eos H100"]
    lines.append("   each layout with FS = v1.0's implied bandwidth and its own round's node rate:")
    lines.append(f"   {'layout':<28} {'node GB/s':>9} " + " ".join(f"{m:>12}" for m in METHODS))
    for label, k, n, local in (("v1.0: 32 x 16, A100", 32, 16, v2), ("v2.0: 128 x 4, A100", 128, 4, v2),
                               ("v3.0: 64 x 4, H100", 64, 4, v3)):
        row = [total(raw, packed, k, n, system(v1, local), m) for m in METHODS]
        lines.append(f"   {label:<28} {local:>9.1f} " + " ".join(f"{t:>11.0f}s" for t in row))
    lines += ["", "2. what sharded reads + Allgatherv buy: packed reads P once, independent K x P, copy K x R.",
              "   With t_local = R / (n x node rate), independent costs max(K P / B, t_local) and packed",
              "   max(P / B, t_local): below B* = K P / t_local the FS read dominates independent and packed",
              "   wins by K P / (B t_local); copy reads 1/compression = "
              f"{raw / packed:.1f}x more again and loses below K R / t_local.", "",
              f"   {'layout':<22} {'t_local s':>9} {'B* independent':>15} {'B* copy':>10}  (GB/s)"]
    for label, k, n, local in (("128 x 4, 6.2 GB/s", 128, 4, v2), ("64 x 4, 9.2 GB/s", 64, 4, v3),
                               ("512 x 1, 6.2 GB/s", 512, 1, v2)):
        t_local = raw / n / (local * GB)
        lines.append(f"   {label:<22} {t_local:>9.0f} {k * packed / t_local / GB:>15,.0f} {k * raw / t_local / GB:>10,.0f}")
    lines.append("")
    lines.append("   ratio independent/packed and copy/packed at 128 x 4 (node 6.2 GB/s) against B:")
    for fs in (100, 250, 500, 1000, 2000, 5000):
        s = system(fs, v2)
        t = {m: total(raw, packed, 128, 4, s, m) for m in METHODS}
        lines.append(f"   B = {fs:>5} GB/s: packed {t['packed']:>7.0f} s, independent {t['independent'] / t['packed']:>5.2f}x, "
                     f"copy {t['copy'] / t['packed']:>6.2f}x")
    return lines, pins


def plot(path: Path, raw: float, packed: float, pins: dict[str, float]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4.2))
    colors = {"packed": "C0", "independent": "C1", "copy": "C2"}
    bw = np.logspace(1, 4, 60)
    v2_local = pins["v2.0 Selene A100"]
    for m in METHODS:
        a.plot(bw, [total(raw, packed, 128, 4, system(x, v2_local), m) for x in bw], color=colors[m], label=m)
    a.scatter([900], [POINTS[1].seconds], color="k", zorder=5)
    a.annotate("v2.0 (402 s; write-up: >900 GB/s reads)", (900, POINTS[1].seconds), textcoords="offset points",
               xytext=(-30, 12), fontsize=7)
    a.set(xscale="log", yscale="log", xlabel="shared filesystem bandwidth B (GB/s, all readers)",
          ylabel="predicted staging time (s)")
    a.set_title(f"128 instances x 4 nodes, node rate {v2_local:.1f} GB/s (v2.0-implied)", fontsize=9)
    ks = [1, 2, 4, 8, 16, 32, 64, 128, 256]
    fs = pins["v1.0 Selene A100"]
    for m in METHODS:
        b.plot(ks, [total(raw, packed, k, 4, system(fs, v2_local), m) for k in ks], color=colors[m], marker="o",
               ms=3, label=f"{m} (4 nodes/instance)")
    b.plot(ks, [total(raw, packed, k, 16, system(fs, v2_local), "copy") for k in ks], color=colors["copy"], ls="--",
           lw=1, label="copy (16 nodes/instance)")
    for p in POINTS:
        b.scatter([p.instances], [p.seconds], color="k", marker="s" if p.method == "copy" else "o", zorder=5)
        b.annotate(f"{p.label} ({p.instances}x{p.nodes_per_instance}, {p.seconds:.0f} s)", (p.instances, p.seconds),
                   textcoords="offset points", xytext=(-60, 8), fontsize=7)
    b.set(xscale="log", yscale="log", xlabel="instances K", ylabel="predicted staging time (s)")
    b.set_xscale("log", base=2)
    b.set_title(f"B = {fs:.0f} GB/s (v1.0-implied), node rate {v2_local:.1f} GB/s", fontsize=9)
    for ax in (a, b):
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=7)
    fig.suptitle(f"CosmoFlow staging model: {raw / 1e12:.1f} TB raw, {packed / 1e12:.2f} TB packed per instance",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" /
                    f"staging_model_{datetime.date.today().isoformat()}", help="writes OUT.txt and OUT.png")
    args = ap.parse_args()
    raw, packed = cosmoflow_size()
    lines, pins = report(raw, packed)
    text = "\n".join(lines) + "\n"
    print(text, end="")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".txt").write_text("# python -m benchmarks.staging_model (formulas only: no machine, no load)\n" + text)
    plot(args.out.with_suffix(".png"), raw, packed, pins)
    print(f"wrote {args.out.with_suffix('.txt')} and {args.out.with_suffix('.png')}")


if __name__ == "__main__":
    main()
