"""PNG plots (matplotlib, Agg backend): weak-scaling instance timeline and throughput per instance,
and a scaling curve when one benchmark was run at several scales."""
from __future__ import annotations

from pathlib import Path

from .scoring import Score

STATUS_COLOURS = {"success": "tab:green", "aborted": "tab:red", "incomplete": "tab:gray"}


def _plt():  # noqa: ANN202
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig, path: Path) -> Path:  # noqa: ANN001
    tmp = path.with_name(f".{path.name}.tmp.png")
    fig.savefig(tmp, dpi=110, bbox_inches="tight")
    tmp.replace(path)
    return path


def timeline(score: Score, path: Path) -> Path:
    """One bar per instance from run_start to run_stop (staging drawn before run_start)."""
    plt = _plt()
    rows = score.runs
    fig, ax = plt.subplots(figsize=(8, 0.35 * len(rows) + 1.6))
    for i, r in enumerate(rows):
        if r.start_offset_s is None or r.time_to_solution_s is None:
            ax.text(0, i, f"{r.name}: {r.status}", va="center", fontsize=8, color="tab:gray")
            continue
        if r.staging_s and r.staging_offset_s is not None:
            ax.barh(i, r.staging_s, left=r.staging_offset_s, color="tab:blue", alpha=0.35,
                    label="staging" if i == 0 else None)
        ax.barh(i, r.time_to_solution_s, left=r.start_offset_s, color=STATUS_COLOURS.get(r.status, "tab:orange"))
    ax.set_yticks(range(len(rows)), [r.name.removesuffix(".txt") for r in rows], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("seconds since the first run_start (staging and init come before it)")
    ttta = "-" if score.ttta_min is None else f"{score.ttta_min * 60:.1f} s"
    ax.set_title(f"{score.benchmark} weak scaling on {score.system}: M'={score.M_prime}/{score.M}, TTTa={ttta}"
                 f"\n(green: converged, red: aborted{', light blue: staging' if any(r.staging_s for r in rows) else ''})",
                 fontsize=10)
    if score.ttta_min is not None:
        ax.axvline(score.ttta_min * 60, color="k", ls="--", lw=0.8)
    fig.tight_layout()
    out = _save(fig, path)
    plt.close(fig)
    return out


def throughput(score: Score, path: Path) -> Path:
    plt = _plt()
    rows = score.runs
    fig, ax = plt.subplots(figsize=(max(4, 0.4 * len(rows) + 2), 3.2))
    vals = [r.samples_per_s or 0.0 for r in rows]
    ax.bar(range(len(rows)), vals, color=[STATUS_COLOURS.get(r.status, "tab:orange") for r in rows])
    ax.set_xticks(range(len(rows)), [r.name.removeprefix("result_").removesuffix(".txt") for r in rows], fontsize=8)
    ax.set_xlabel("instance")
    ax.set_ylabel("training samples / s")
    ax.set_title(f"{score.benchmark} on {score.system}: throughput per instance", fontsize=10)
    fig.tight_layout()
    out = _save(fig, path)
    plt.close(fig)
    return out


def scaling_curve(scores: list[Score], path: Path) -> Path:
    """Weak: models/min against system scale T. Strong: score [min] against nodes."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(5, 3.4))
    mode = scores[0].mode
    pts = sorted((s.T if mode == "weak" else s.S or 0, s.models_per_min if mode == "weak" else s.score_min)
                 for s in scores)
    xs, ys = [p[0] for p in pts], [p[1] or 0.0 for p in pts]
    ax.plot(xs, ys, "o-")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("system scale T" if mode == "weak" else "nodes per run")
    ax.set_ylabel("models / min" if mode == "weak" else "time to solution [min]")
    ax.set_title(f"{scores[0].benchmark} {mode} scaling", fontsize=10)
    fig.tight_layout()
    out = _save(fig, path)
    plt.close(fig)
    return out
