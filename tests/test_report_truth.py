"""What the report calls scored and valid: a log the official compliance checker or our own checks
reject (duplicated runs, an unknown benchmark, non-finite or absurd times) is never scored, and
"valid MLPerf result" means every official tool passes, the run count is met and no log was rejected."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from hpcbench.report.build import build
from hpcbench.report.logs import MAX_RUN_S, parse_log
from mllog_synth import T0_MS, SynthRun, write_benchmark, write_log
from conftest import run_cli

TIMES = [300, 320, 310, 350, 330]


def _strong(root: Path, n: int = 5) -> Path:
    return write_benchmark(root, "strong", [SynthRun(i * 1000.0, TIMES[i % 5] + i, seed=i) for i in range(n)])


def _set_time(path: Path, key: str, time_ms: float, last: bool = True) -> None:
    """Give the last (or first) record ``key`` of the log the time ``time_ms`` (NaN allowed: json writes it)."""
    lines = path.read_text().splitlines(keepends=True)
    idx = [i for i, ln in enumerate(lines) if f'"key": "{key}"' in ln]
    i = idx[-1] if last else idx[0]
    rec = json.loads(lines[i].split(":::MLLOG ", 1)[1])
    rec["time_ms"] = time_ms
    lines[i] = ":::MLLOG " + json.dumps(rec) + "\n"
    path.write_text("".join(lines))


def test_duplicated_log_is_rejected_and_the_mean_agrees_with_the_summarizer(tmp_path: Path) -> None:
    folder = _strong(tmp_path)
    dup = folder / "result_2.txt"
    dup.write_text(dup.read_text() * 2)  # the same run twice in one file
    (g,) = build(tmp_path, None).groups
    row = next(r for r in g.score.runs if r.name == "result_2.txt")
    assert not row.converged and row.status == "rejected"
    assert any("second run_start" in w for w in row.rejected)
    assert any(w.startswith("official compliance checker:") and "EXACTLY_ONE" in w for w in row.rejected)
    assert g.official is not None and g.official.produced
    assert g.score.score_min == pytest.approx(g.official.score_min, abs=1e-6)  # counted as a failed run by both
    ok = sorted(TIMES[i] + i for i in range(5) if i != 2)
    assert g.score.score_min == pytest.approx(sum(ok[1:]) / 3 / 60.0)
    assert not g.disagreements, g.disagreements
    assert not g.verdict.valid
    assert any(f.startswith("result_2.txt: rejected, not scored") for f in g.verdict.failures)


def test_unknown_benchmark_log_is_rejected_with_the_checkers_reason(tmp_path: Path) -> None:
    folder = _strong(tmp_path)
    (folder / "result_4.txt").unlink()  # the logger appends
    write_log(folder / "result_4.txt", SynthRun(4000.0, 100.0, seed=4), benchmark="nosuchbench")
    proc = run_cli(["report", str(tmp_path), "--no-plots"], timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr  # reported, not an error ...
    assert "REJECTED result_4.txt (not scored): official compliance checker:" in proc.stdout
    assert "DISAGREEMENT" not in proc.stdout
    (g,) = json.loads((tmp_path / "report" / "report.json").read_text())["groups"]
    assert "nosuchbench" in g["score"]["rejected"][0][1]
    ok = sorted(TIMES[i] + i for i in range(4))  # the rejected log counts as the dropped failed run
    assert g["score"]["score_min"] == pytest.approx(sum(ok[1:]) / 3 / 60.0)
    # the official summarizer crashes on that log (no rules for the benchmark): it judged nothing, and
    # the folder is not valid because of it as well as because of the rejected log
    assert g["official"]["crashed"] and g["official"]["score_min"] is None
    assert not g["verdict"]["valid"]
    assert any(f.startswith("official result summarizer: no score") for f in g["verdict"]["failures"])
    assert any(f.startswith("result_4.txt: rejected, not scored") for f in g["verdict"]["failures"])
    proc = run_cli(["report", str(tmp_path), "--no-plots", "--strict"], timeout=120)
    assert proc.returncode == 1  # ... and a failure under --strict


def _to_seconds(path: Path) -> None:
    """Every record's time_ms divided by 1000 (a log written with seconds where milliseconds belong)."""
    out = []
    for ln in path.read_text().splitlines(keepends=True):
        if ":::MLLOG " in ln:
            rec = json.loads(ln.split(":::MLLOG ", 1)[1])
            rec["time_ms"] = rec["time_ms"] / 1000.0
            ln = ":::MLLOG " + json.dumps(rec) + "\n"
        out.append(ln)
    path.write_text("".join(out))


@pytest.mark.parametrize("case", ["nan_stop", "huge_stop", "negative", "eval_early", "stop_before_evals", "seconds"])
def test_absurd_times_are_flagged_and_not_scored(tmp_path: Path, case: str) -> None:
    folder = _strong(tmp_path)
    log = folder / "result_1.txt"
    start = T0_MS + 1000.0 * 1000.0
    if case == "nan_stop":
        _set_time(log, "run_stop", float("nan"))
        want = "run_stop at time_ms=nan (not a finite time)"
    elif case == "huge_stop":
        _set_time(log, "run_stop", 1e20)
        want = "beyond a week"
    elif case == "negative":
        _set_time(log, "run_stop", start - 5000.0)
        want = "negative time to solution: run_stop is 5.000 s before run_start"
    elif case == "eval_early":
        _set_time(log, "eval_error", start - 10.0, last=False)
        want = "eval_error is before run_start"
    elif case == "stop_before_evals":  # a 1 ms run whose evaluations come after its end (hostile-input audit)
        _set_time(log, "run_stop", start + 1.0)
        want = "is after run_stop"
    else:  # the whole log in seconds: every record in order, a "run" of a fraction of a second
        _to_seconds(log)
        want = "is not a Unix time in milliseconds"
    parsed = parse_log(log)
    assert any(want in w for w in parsed.rejections), parsed.rejections
    assert parsed.rejected and not parsed.converged and parsed.outcome == "rejected"
    (g,) = build(tmp_path, tmp_path / "plots", official=False).groups
    row = next(r for r in g.score.runs if r.name == "result_1.txt")
    assert row.status == "rejected" and row.time_to_solution_s is None  # no absurd time in tables or plots
    ok = sorted(TIMES[i] + i for i in range(5) if i != 1)
    assert g.score.score_min == pytest.approx(sum(ok[1:]) / 3 / 60.0)  # counted as the dropped failed run
    assert any("rejected log not scored" in n for n in g.score.notes)
    assert not g.verdict.valid and any(f.startswith("result_1.txt: rejected") for f in g.verdict.failures)


def test_nan_stop_with_the_official_tools_is_a_listed_disagreement(tmp_path: Path) -> None:
    """The official checker accepts a NaN run_stop and the summarizer writes no mean (an empty cell); we
    reject the log and score the rest: both differences are listed, not hidden, and the folder is not valid."""
    folder = _strong(tmp_path)
    _set_time(folder / "result_1.txt", "run_stop", float("nan"))
    (g,) = build(tmp_path, None).groups
    assert g.official is not None and not g.official.produced and g.official.compliance["result_1.txt"][0]
    assert {c.what.split(":")[0] for c in g.disagreements} == {"result_1.txt", "olympic mean produced"}
    assert not g.verdict.valid


def test_a_week_is_the_limit(tmp_path: Path) -> None:
    assert not parse_log(write_log(tmp_path / "result_0.txt", SynthRun(0.0, MAX_RUN_S - 1))).rejections
    assert parse_log(write_log(tmp_path / "result_1.txt", SynthRun(0.0, MAX_RUN_S + 1))).rejections


def test_weak_instance_with_a_nan_stop_is_not_in_ttta(tmp_path: Path) -> None:
    folder = write_benchmark(tmp_path, "weak", [SynthRun(0.1 * i, 60.0 + i, seed=i) for i in range(3)])
    _set_time(folder / "result_2.txt", "run_stop", 1e20)
    (g,) = build(tmp_path, tmp_path / "plots", official=False).groups
    assert g.score.M_prime == 2 and g.score.ttta_min == pytest.approx(61.1 / 60.0)
    assert g.score.job_span_min == pytest.approx(61.1 / 60.0)  # ours also leaves the absurd time out


def test_valid_means_official_tools_run_count_and_no_rejection(tmp_path: Path) -> None:
    _strong(tmp_path, 10)  # cosmoflow asks for 10 runs
    (g,) = build(tmp_path, None).groups
    assert g.verdict.valid, g.verdict.failures
    assert g.verdict.label.startswith("yes (open-division checks")
    assert not g.disagreements
    (g,) = build(tmp_path, None, official=False).groups  # nothing official ran: not called valid
    assert not g.verdict.valid and g.verdict.failures[0].startswith("official tools: not run")
    assert g.score.scored  # our figure and run count are there all the same
    (tmp_path / "results" / "testbox" / "strong" / "cosmoflow" / "result_9.txt").unlink()
    (g,) = build(tmp_path, None).groups
    assert not g.verdict.valid and "run count: 9 of the 10 runs the rules require" in g.verdict.failures


def test_a_setting_logged_twice_with_two_values_is_flagged(tmp_path: Path) -> None:
    """global_batch_size logged twice with different values (the official checker reads one of them and passes
    the log): the report flags the contradiction, so the folder is not called valid."""
    folder = _strong(tmp_path)
    log = folder / "result_3.txt"
    lines = log.read_text().splitlines(keepends=True)
    i = next(k for k, ln in enumerate(lines) if '"key": "global_batch_size"' in ln)
    rec = json.loads(lines[i].split(":::MLLOG ", 1)[1])
    rec["value"] = 999
    lines.insert(i + 1, ":::MLLOG " + json.dumps(rec) + "\n")
    log.write_text("".join(lines))
    parsed = parse_log(log)
    assert any("global_batch_size logged again with another value" in p for p in parsed.problems), parsed.problems
    (g,) = build(tmp_path, None, official=False).groups
    assert any(f.startswith("result_3.txt: line") and "logged again" in f for f in g.score.flags), g.score.flags
    assert not g.verdict.valid


def test_a_time_beyond_the_float_range_is_a_bad_line_not_a_crash(tmp_path: Path) -> None:
    folder = _strong(tmp_path)
    log = folder / "result_2.txt"
    lines = log.read_text().splitlines(keepends=True)
    i = next(k for k, ln in enumerate(lines) if '"key": "epoch_start"' in ln)
    rec = json.loads(lines[i].split(":::MLLOG ", 1)[1])
    lines[i] = ":::MLLOG " + json.dumps(rec).replace(str(rec["time_ms"]), "1" + "0" * 400) + "\n"
    log.write_text("".join(lines))
    parsed = parse_log(log)
    assert any("beyond the float range" in b for b in parsed.bad_lines) and parsed.outcome == "unreadable"
