"""`hpcbench report` on logs altered the way an auditor alters them (found by an audit, 2026-12-02): a wrongly
typed value, a record that is not a record, two writers on one line, a time written as a string, a missing
run_start, a status in capitals. The report never crashes on them, reads a line as the official parser reads
it, scores what the official summarizer scores, and says what it saw without false alarms."""
from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from hpcbench.report.build import build
from hpcbench.report.logs import parse_log
from hpcbench.report.prune import plan
from mllog_synth import SynthRun, write_benchmark, write_log

TIMES = [300, 320, 310, 350, 330]


def _strong(root: Path) -> Path:
    return write_benchmark(root, "strong", [SynthRun(i * 1000.0, TIMES[i] + i, seed=i) for i in range(5)])


def _edit(path: Path, key: str, change: Callable[[dict], dict | str | None], last: bool = True) -> None:
    """Replace the last (or first) record of ``key``: ``change`` returns the new record, a raw line (str) or None
    (delete the line)."""
    lines = path.read_text().splitlines(keepends=True)
    idx = [i for i, ln in enumerate(lines) if f'"key": "{key}"' in ln]
    i = idx[-1] if last else idx[0]
    new = change(json.loads(lines[i].split(":::MLLOG ", 1)[1]))
    if new is None:
        del lines[i]
    else:
        lines[i] = (new if isinstance(new, str) else ":::MLLOG " + json.dumps(new)) + "\n"
    path.write_text("".join(lines))


def _agrees(root: Path):  # noqa: ANN202
    (g,) = build(root, None).groups
    assert g.official is not None and g.official.produced, g.official
    assert g.score.score_min == pytest.approx(g.official.score_min, abs=1e-6)
    assert not g.disagreements, g.disagreements
    return g


def _row(g, name: str = "result_3.txt"):  # noqa: ANN001, ANN202
    return next(r for r in g.score.runs if r.name == name)


@pytest.mark.parametrize(("key", "value", "named"), [
    ("number_of_nodes", "one", "number_of_nodes is 'one', expected an integer"),
    ("seed", "abc", "seed is 'abc', expected an integer"),
])
def test_a_count_logged_as_a_word_is_named_not_a_crash(tmp_path: Path, key: str, value: str, named: str) -> None:
    log = _strong(tmp_path) / "result_3.txt"
    _edit(log, key, lambda r: {**r, "value": value}, last=False)
    g = _agrees(tmp_path)  # was: ValueError from int('one'), TypeError sorting a str seed among ints
    assert any(named in p for p in _row(g).problems), _row(g).problems
    assert _row(g).converged


def test_a_record_whose_key_is_not_a_string_is_skipped_and_named(tmp_path: Path) -> None:
    log = _strong(tmp_path) / "result_3.txt"
    _edit(log, "epoch_start", lambda r: {**r, "key": 5})  # was: AttributeError: 'int' has no 'startswith'
    g = _agrees(tmp_path)
    assert any("key 5 is not a string (record ignored)" in p for p in _row(g).problems)


@pytest.mark.parametrize(("key", "meta"), [("eval_error", [1]), ("run_stop", "success")])
def test_metadata_that_is_not_an_object_is_named_and_the_checkers_rejection_followed(
        tmp_path: Path, key: str, meta: object) -> None:
    log = _strong(tmp_path) / "result_3.txt"
    _edit(log, key, lambda r: {**r, "metadata": meta})  # was: AttributeError: no attribute 'get'
    assert any(f"metadata of '{key}' is {type(meta).__name__}" in p for p in parse_log(log).problems)
    g = _agrees(tmp_path)  # the official checker drops the file; so do we
    assert _row(g).status == "rejected" and not _row(g).converged


def test_two_writers_on_one_line_are_read_as_the_official_parser_reads_them(tmp_path: Path) -> None:
    log = _strong(tmp_path) / "result_3.txt"
    # a killed writer's half record, then the whole run_stop on the same line: the official parser keeps the
    # text from the last ':::MLLOG ' (re.sub(".*" + TOKEN, TOKEN, line)), and so do we (was: the first, unreadable)
    _edit(log, "run_stop", lambda r: ':::MLLOG {"namespace": "", "time_ms": 17' + ":::MLLOG " + json.dumps(r))
    parsed = parse_log(log)
    assert not parsed.bad_lines and parsed.converged
    g = _agrees(tmp_path)
    assert _row(g).converged


def test_a_time_written_as_a_string_is_read_as_float_reads_it(tmp_path: Path) -> None:
    log = _strong(tmp_path) / "result_3.txt"
    _edit(log, "run_stop", lambda r: {**r, "time_ms": repr(r["time_ms"])})  # the official float(m['time_ms'])
    assert parse_log(log).converged
    g = _agrees(tmp_path)
    assert _row(g).time_to_solution_s == pytest.approx(TIMES[3] + 3)
    _edit(log, "run_stop", lambda r: {**r, "time_ms": "1.2.3"})  # not a number: the line is unreadable
    assert any("time_ms of 'run_stop' is not a number ('1.2.3')" in b for b in parse_log(log).bad_lines)


def test_a_missing_run_start_is_named_without_false_contradictions(tmp_path: Path) -> None:
    log = _strong(tmp_path) / "result_3.txt"
    for first, rate in ((True, 10.0), (False, 12.0)):  # each epoch's tracked_stats: a new value by design
        _edit(log, "epoch_stop", lambda r, rate=rate: ":::MLLOG " + json.dumps(r) + "\n:::MLLOG " + json.dumps(
            {**r, "key": "tracked_stats", "event_type": "POINT_IN_TIME", "value": {"throughput": rate},
             "metadata": {"step": r["metadata"]["epoch_num"]}}), last=not first)
    _edit(log, "run_start", lambda r: None)  # was: every later tracked_stats flagged as a contradicted setting
    parsed = parse_log(log)
    assert "no run_start" in parsed.problems
    assert not [p for p in parsed.problems if "logged again with another value" in p], parsed.problems
    g = _agrees(tmp_path)
    assert not _row(g).converged


def test_status_is_read_as_the_checker_reads_it(tmp_path: Path) -> None:
    folder = _strong(tmp_path)
    _edit(folder / "result_3.txt", "run_stop", lambda r: {**r, "metadata": {"status": "SUCCESS"}})
    _edit(folder / "result_1.txt", "run_stop", lambda r: {**r, "metadata": {}})
    caps, none = parse_log(folder / "result_3.txt"), parse_log(folder / "result_1.txt")
    assert caps.status == "success" and caps.converged and not caps.problems, caps.problems
    assert "run_stop has no status" in none.problems
    assert not [p for p in none.problems if "counted" in p], none.problems  # was: "says nothing ...: counted"
    _agrees(tmp_path)


def test_a_shared_seed_in_the_open_division_does_not_claim_the_official_check_fails(tmp_path: Path) -> None:
    write_benchmark(tmp_path, "strong", [SynthRun(i * 1000.0, TIMES[i] + i, seed=7 if i < 2 else i) for i in range(5)])
    (g,) = build(tmp_path, None).groups
    (flag,) = [f for f in g.score.flags if f.startswith("runs share a seed")]
    assert "checks seeds in the closed division only" in flag and "check fails" not in flag


def test_prune_leaves_a_log_the_official_checker_rejects_in_place(tmp_path: Path) -> None:
    """A deepcam-labelled log in a cosmoflow weak folder: the report rejects it (official compliance checker),
    so --prune-failed must not move it as a failed instance (was: moved as target_missed)."""
    folder = write_benchmark(tmp_path, "weak", [SynthRun(0.1 * i, 60.0 + i, seed=i) for i in range(4)])
    stranger = write_log(folder / "result_4.txt", SynthRun(0.5, 61.0, seed=4), benchmark="deepcam")
    moves, kept = plan(tmp_path / "results")
    assert stranger not in [m.source for m in moves]
    assert [p for p, _ in kept] == [stranger] and kept[0][1].startswith("official compliance checker:")


def test_prune_checks_the_logs_under_the_ruleset_the_report_uses(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``hpcbench report --prune-failed --ruleset hpc=2.0.0``: the failed instances are judged under the ruleset the
    report then scores with (was: the logs' default, whatever --ruleset said)."""
    from hpcbench.report import official

    folder = write_benchmark(tmp_path, "weak", [SynthRun(0.1 * i, 60.0 + i, seed=i) for i in range(4)])
    write_log(folder / "result_4.txt", SynthRun(0.5, 61.0, seed=4, status="aborted", final_error=0.5))
    seen: list[tuple[str, str]] = []

    def spy(path: Path, usage: str, ruleset: str) -> tuple[bool, str]:
        seen.append((usage, ruleset))
        return True, ""

    monkeypatch.setattr(official, "check_compliance", spy)
    plan(tmp_path / "results", {"hpc": "2.0.0"})
    assert seen and set(seen) == {("hpc", "2.0.0")}
