"""The GPU check's results: one JSON document (what was measured), rendered as the text file that goes
under benchmarks/results/, and merged from parts (one device command runs at most 10 minutes, so a
session measures the workloads in parts and merges them into one file)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hpcbench.common.atomic import atomic_write


def _ratio(x: float, ref: float) -> str:
    return f"{x / ref:.2f}x" if ref > 0 and x > 0 else "-"


def _flops(row: dict[str, Any], rate: float, peak: float) -> str:
    fps = row.get("flops_per_sample", 0.0)
    if row.get("flops_error"):
        return f" | FLOPs not counted: {row['flops_error']}"
    if not fps or rate <= 0:
        return ""
    achieved = fps * rate
    share = f" = {100 * achieved / peak:.1f}% of the peak" if peak > 0 else ""
    return f" | {fps / 1e9:.3g} GFLOP/sample, {achieved / 1e12:.3g} TFLOP/s{share}"


def render_batch(name: str, row: dict[str, Any], peak: float) -> list[str]:
    nv, comparable = row.get("nvidia"), row.get("comparable", False)
    ref = nv["per_gpu"] if nv and comparable else 0.0
    if nv:
        vs = (f"NVIDIA H100 per GPU {nv['per_gpu']:g} samples/s at local batch {nv['local_batch']} ({nv['source']})"
              + ("" if comparable else "; not compared: another batch or the mini preset"))
    else:
        vs = f"NVIDIA: {row.get('missing', 'no figure')}"
    out = [f"== {name}, local batch {row['batch']}: {vs}"]
    best = 0.0
    for mode, m in row.get("model_only", {}).items():
        if "error" in m:
            out.append(f"  model-only {mode:10s}: FAILED {m['error']}")
            continue
        best = max(best, m["samples_per_s"])
        out.append(f"  model-only {mode:10s}: {m['samples_per_s']:10.1f} samples/s ({m['steps']} steps of "
                   f"{m['samples_per_step']})  {_ratio(m['samples_per_s'], ref):>6s} NVIDIA"
                   + _flops(row, m["samples_per_s"], peak))
    for key, label in (("loader", "files -> loader -> device"), ("cache", "from the cache")):
        e = row.get(key)
        if not e:
            continue
        if not e["cache"]:
            out.append(f"  end to end, {label}: {e['status']}")
            continue
        rate = e["rate"]
        epochs = ", ".join(f"{r:.1f}" for r in e["per_epoch"]) or "none"
        model = row.get("model_only", {}).get(e["mode"], {}).get("samples_per_s", 0.0)
        out.append(f"  end to end, {label} (data.cache={e['cache']}, {e['mode']}): {rate:.1f} samples/s after "
                   f"epoch 1 (epochs {epochs}; {e['status']})  {_ratio(rate, ref)} NVIDIA, "
                   f"{_ratio(rate, model)} of model-only {e['mode']}")
        split = e.get("per_step_ms")
        if split:  # where the end-to-end step's time goes (results written before this split have none)
            out.append(f"    per step after epoch 1: loader wait {split['data_wait']:.3f} ms, step (host side) "
                       f"{split['step']:.3f} ms, rest {split['rest']:.3f} ms (harness, epoch start, device queue "
                       f"drained at the epoch's end) over {split['steps']:.0f} steps")
    return out


def render(res: dict[str, Any]) -> list[str]:
    lines = [res["machine"], res.get("device_line", "")]
    if not res.get("complete", True):
        lines.append("# PARTIAL: this run stopped before its end (its device call's limit or a crash); every "
                     "figure below was measured, those it did not reach are missing")
    lines.append(f"# preset {res['preset']}; peak: {res['peak']['what']} {res['peak']['flops'] / 1e12:.1f} TFLOP/s")
    t = res.get("tests")
    if t:
        counts = ", ".join(f"{v} {k}" for k, v in sorted(t["counts"].items())) or "no summary line"
        lines.append(f"== GPU tests ({t['selection']}: {len(t['files'])} files; exit {t['exit_code']}, "
                     f"{t['seconds']:.0f} s): {counts}")
        lines += [f"  {p}" for p in t["problems"]]
    for name, w in res["workloads"].items():
        if w.get("error"):
            lines.append(f"== {name}: FAILED {w['error']}")
            continue
        if not w.get("batches"):
            lines.append(f"== {name}: started, no figure measured (the run stopped while writing its data or "
                         "in its first measurement)")
            continue
        if w.get("note"):
            lines.append(f"# {name}: {w['note']}")
        for row in w["batches"]:
            lines += render_batch(name, row, res["peak"]["flops"])
    skipped = res.get("skipped", [])
    lines.append(f"# skipped: {'; '.join(skipped) if skipped else 'nothing'}")
    return [ln for ln in lines if ln]


def merge(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """One result from several parts of the same session: the first part's machine and peak, every
    part's workloads (a later part's measurement of a workload wins), tests from the part that ran them."""
    if not parts:
        raise SystemExit("--merge: no result files given")
    out = dict(parts[0])
    out["workloads"], out["skipped"] = {}, []
    out["complete"] = all(p.get("complete", True) for p in parts)
    for p in parts:
        out["workloads"].update(p.get("workloads", {}))
        out["skipped"] += p.get("skipped", [])
        if p.get("tests"):
            out["tests"] = p["tests"]
    return out


def load(path: Path) -> dict[str, Any]:
    try:
        res = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise SystemExit(f"{path}: not a gpu_check JSON result ({exc})") from None
    missing = [k for k in ("machine", "preset", "peak", "workloads") if k not in res]
    if missing:
        raise SystemExit(f"{path}: not a gpu_check JSON result (no key {', '.join(missing)})")
    return res


def write(res: dict[str, Any], out: Path) -> tuple[Path, Path]:
    """``out`` (.txt) and its .json, each written to a temporary file, read back and compared, then renamed."""
    text = "\n".join(render(res)) + "\n"
    doc = json.dumps(res, indent=1, sort_keys=True) + "\n"
    txt, js = out.with_suffix(".txt"), out.with_suffix(".json")
    for path, body in ((js, doc), (txt, text)):
        def verify(tmp: Path, body: str = body, path: Path = path) -> None:
            if tmp.read_text() != body:
                raise SystemExit(f"{path}: the written file does not read back as written")

        with atomic_write(path, "w", verify=verify) as fh:
            fh.write(body)
    return txt, js
