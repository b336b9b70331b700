"""PNG plots (matplotlib, Agg backend): each instance's quality metric against time and epochs,
the weak-scaling instance timeline, throughput per instance, and a scaling curve when one benchmark
was run at several scales. Every title names the MLPerf division."""
from __future__ import annotations

from pathlib import Path

from hpcbench import registry

from .logs import RunLog
from .scoring import Score
from .targets import target_for

STATUS_COLOURS = {"success": "tab:green", "aborted": "tab:red", "incomplete": "tab:gray",
                  "target_missed": "tab:orange", "unreadable": "tab:purple",
                  "rejected": "black"}
LEGEND_MAX = 16  # instances named in a legend; more are drawn but not listed


def _division(score: Score) -> str:
    return f"{score.division or 'unknown'} division"


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
    ax.set_title(f"{score.benchmark} weak scaling on {score.system} ({_division(score)}): "
                 f"M'={score.M_prime}/{score.M}, TTTa={ttta}\n(green: converged, red: aborted, orange: target "
                 f"missed{', light blue: staging' if any(r.staging_s for r in rows) else ''}; "
                 "dashed: end of TTTa)", fontsize=10)
    counted = [r for r in rows if r.converged and r.start_offset_s is not None]
    if score.ttta_min is not None and counted:
        ax.axvline(min(r.start_offset_s for r in counted) + score.ttta_min * 60,  # type: ignore[type-var]
                   color="k", ls="--", lw=0.8)
    fig.tight_layout()
    out = _save(fig, path)
    plt.close(fig)
    return out


def quality(score: Score, runs: list[RunLog], path: Path) -> Path:
    """Each instance's quality metric against minutes since the first run_start and against epochs,
    with the benchmark's target line: what converged, how fast, and which run fell short."""
    plt = _plt()
    tgt = target_for(score.benchmark)
    starts = [r.run_start_ms for r in runs if r.run_start_ms is not None]
    t0 = min(starts) if starts else None
    fig, (ax_t, ax_e) = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
    cmap = plt.get_cmap("tab20" if len(runs) > 10 else "tab10")
    key = next((r.metric_key for r in runs if r.metric_key), tgt.key if tgt else "metric")
    span_ms = max((e.time_ms for r in runs for e in r.metrics), default=0.0) - (t0 or 0.0)
    unit, per = ("seconds", 1000.0) if t0 is not None and span_ms < 120_000 else ("minutes", 60000.0)
    for i, r in enumerate(runs):
        if not r.metrics:
            continue
        style = "-" if r.converged else ":"
        label = f"{r.name.removeprefix('result_').removesuffix('.txt')} ({r.outcome})" if i < LEGEND_MAX else None
        base = t0 if t0 is not None else r.metrics[0].time_ms
        ax_t.plot([(e.time_ms - base) / per for e in r.metrics], [e.value for e in r.metrics], style,
                  marker=".", color=cmap(i % cmap.N), label=label, lw=1.2)
        ax_e.plot([e.epoch for e in r.metrics], [e.value for e in r.metrics], style, marker=".",
                  color=cmap(i % cmap.N), lw=1.2)
    for ax in (ax_t, ax_e):
        if tgt is not None:
            ax.axhline(tgt.threshold, color="k", ls="--", lw=1.0)
        ax.grid(alpha=0.3)
    if tgt is not None:
        ax_t.text(0.01, tgt.threshold, f" target {tgt.describe()}", transform=ax_t.get_yaxis_transform(),
                  va="bottom", fontsize=8)
    ax_t.set_xlabel(f"{unit} since the first run_start")
    reporting = registry.epoch_reporting(score.benchmark)
    ax_e.set_xlabel({"samples": "training samples (epoch_num)", "fraction": "epoch (epoch_num, fractional)"}
                    .get(reporting, "epoch"))
    from matplotlib.ticker import MaxNLocator

    if reporting == "epoch":
        ax_e.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax_t.set_ylabel(key)
    if any(r.metrics for r in runs[:LEGEND_MAX]):
        ax_t.legend(fontsize=7, ncol=2 if len(runs) > 8 else 1, title="instance (outcome)", title_fontsize=7)
    more = f"; {len(runs) - LEGEND_MAX} more not in the legend" if len(runs) > LEGEND_MAX else ""
    fig.suptitle(f"{score.benchmark} {score.mode} on {score.system} ({_division(score)}): quality per instance\n"
                 f"(solid: counted as converged, dotted: not counted; dashed line: target{more})", fontsize=10)
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
    ax.set_title(f"{score.benchmark} {score.mode} on {score.system} ({_division(score)}):\n"
                 "throughput per instance (samples / time in epochs)", fontsize=10)
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
    divs = sorted({s.division or "unknown" for s in scores})
    ax.set_title(f"{scores[0].benchmark} {mode} scaling ({'/'.join(divs)} division)", fontsize=10)
    fig.tight_layout()
    out = _save(fig, path)
    plt.close(fig)
    return out
