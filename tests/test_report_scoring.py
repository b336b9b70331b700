"""`hpcbench report` on hand-made logs in the real MLLOG format: our scores against the rules and
against the official result summarizer and compliance checker."""
from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from hpcbench.report.build import build
from hpcbench.report.logs import parse_log
from hpcbench.registry import REQUIRED_RUNS
from hpcbench.report.scoring import olympic_mean
from mllog_synth import SynthRun, write_benchmark, write_log
from conftest import run_cli


def test_olympic_mean_matches_official_and_required_runs_match_meta() -> None:
    from mlperf_logging.benchmark_meta import get_result_file_counts
    from mlperf_logging.result_summarizer.result_summarizer import _compute_olympic_average

    times = [5.0, 3.0, 4.0, 9.0, 6.0]
    assert olympic_mean(times, 0) == pytest.approx((4 + 5 + 6) / 3)
    assert olympic_mean(times, 0) == pytest.approx(_compute_olympic_average(list(times), 0, 1))
    assert olympic_mean(times[:4], 1) == pytest.approx(_compute_olympic_average(list(times[:4]), 1, 1))
    assert olympic_mean(times[:3], 2) is None
    assert olympic_mean([1.0, 2.0], 0) is None
    counts = get_result_file_counts("hpc")
    for bench in ("cosmoflow", "deepcam", "oc20"):
        assert REQUIRED_RUNS[bench] == counts[bench]


def test_parse_log_reads_times_staging_epochs(tmp_path: Path) -> None:
    log = parse_log(write_log(tmp_path / "result_0.txt", SynthRun(2.0, 90.0, epochs=4, staging_s=3.0, seed=7)))
    assert log.time_to_solution_s == pytest.approx(90.0)
    assert log.staging_ms == pytest.approx(3000.0)
    assert log.epochs == 4 and log.seed == 7 and log.converged
    assert log.samples_per_s == pytest.approx(64 * 4 / (0.8 * 90.0))
    assert log.metric_key == "eval_error" and (log.metrics[-1].epoch, log.metrics[-1].value) == (4, pytest.approx(0.1))


def test_bad_line_is_named_and_the_run_not_counted(tmp_path: Path) -> None:
    p = write_log(tmp_path / "result_0.txt", SynthRun(0, 10))
    lines = p.read_text().splitlines(keepends=True)
    p.write_text("".join(lines[:3]) + ':::MLLOG {"key": "seed", broken\n' + "".join(lines[3:]))
    log = parse_log(p)
    assert log.complete and log.status == "success" and not log.converged and log.outcome == "unreadable"
    assert len(log.bad_lines) == 1 and log.bad_lines[0].startswith("line 4: MLLOG line is not valid JSON")
    assert "line 4: MLLOG line is not valid JSON" in " ".join(log.problems)


def test_strong_scaling_olympic_and_one_failure_agree_with_official(tmp_path: Path) -> None:
    times = [300, 320, 310, 350, 330]
    runs = [SynthRun(i * 1000.0, t, seed=i) for i, t in enumerate(times)]
    runs[3] = SynthRun(3000.0, 350, status="aborted", final_error=0.5)  # never reached the target
    write_benchmark(tmp_path, "strong", runs, benchmark="cosmoflow")
    (rep,) = build(tmp_path, tmp_path / "out").groups
    ok = sorted([300, 320, 310, 330])
    assert rep.score.score_min == pytest.approx(sum(ok[1:]) / 3 / 60.0)  # failure = the dropped slowest
    assert rep.official is not None and rep.official.score_min == pytest.approx(rep.score.score_min)
    assert rep.official.compliance["result_3.txt"][0] is False
    assert not rep.disagreements, rep.disagreements
    assert not rep.verdict.valid and any("5 of the 10 runs" in n for n in rep.score.notes)
    assert "run count: 5 of the 10 runs the rules require" in rep.verdict.failures


def test_strong_scaling_two_failures_give_no_score(tmp_path: Path) -> None:
    runs = [SynthRun(i * 1000.0, 300 + i, status="aborted" if i < 2 else "success",
                     final_error=0.5 if i < 2 else 0.1) for i in range(5)]
    write_benchmark(tmp_path, "strong", runs, benchmark="cosmoflow")
    (rep,) = build(tmp_path, None).groups
    assert rep.score.score_min is None and rep.official.score_min is None
    assert any("at most 1" in n for n in rep.score.notes)


def test_weak_scaling_two_instances_cli(tmp_path: Path) -> None:
    runs = [SynthRun(0.0, 100.0, nodes=2, staging_s=5.0, seed=11), SynthRun(4.0, 116.0, nodes=2, staging_s=6.0, seed=12)]
    write_benchmark(tmp_path, "weak", runs, benchmark="cosmoflow", system="box")
    proc = run_cli(["report", str(tmp_path), "--strict"], timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "agree on every figure they both produced" in proc.stdout
    data = json.loads((tmp_path / "report" / "report.json").read_text())
    (g,) = data["groups"]
    s = g["score"]
    assert (s["M"], s["M_prime"], s["S"], s["T"]) == (2, 2, 2, 4)
    assert s["ttta_min"] == pytest.approx(120.0 / 60.0)
    assert s["models_per_min"] == pytest.approx(2 / 2.0)
    # the official summarizer wants >= 10 cosmoflow models: it produced nothing, and the report says so
    assert g["official"]["produced"] is False and g["official"]["score_min"] is None
    assert "Not enough converging weak scaling runs" in g["official"]["why_none"]
    ttta = next(c for c in g["checks"] if c["what"] == "TTTa (min)")
    assert ttta["official"] == "none produced" and ttta["agree"] is None
    assert "official summarizer produced no score for this folder" in proc.stdout
    assert [r["staging_s"] for r in s["runs"]] == [pytest.approx(5.0), pytest.approx(6.0)]
    rows = list(csv.DictReader((tmp_path / "report" / "report.csv").open()))
    assert [r["run"] for r in rows] == ["result_0.txt", "result_1.txt"]
    for name in ("box_weak_cosmoflow_timeline.png", "box_weak_cosmoflow_throughput.png"):
        assert (tmp_path / "report" / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_aborted_but_target_met_counts_as_official_and_is_flagged(tmp_path: Path) -> None:
    """The official checker does not read run_stop's status: a log that says aborted but whose eval met
    the target is counted by both (they agree), and the report flags the contradiction in the log (an
    inconsistency: the folder is not called valid and --strict exits 1)."""
    runs = [SynthRun(0.0, 50.0), SynthRun(1.0, 80.0, status="aborted", final_error=0.1)]
    write_benchmark(tmp_path, "weak", runs)
    proc = run_cli(["report", str(tmp_path), "--strict", "--no-plots"], timeout=120)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "agree on every figure they both produced" in proc.stdout
    assert "inconsistency: result_1.txt: run_stop says aborted but an evaluation met the target" in proc.stdout
    (g,) = json.loads((tmp_path / "report" / "report.json").read_text())["groups"]
    assert g["score"]["M_prime"] == 2 and not g["verdict"]["valid"]


def test_weak_log_the_checker_rejects_is_not_scored(tmp_path: Path) -> None:
    """An instance our parse would count (complete, target met) that the official compliance checker
    rejects (the required cache_clear event is missing): listed as rejected with the checker's reason,
    not in M' or TTTa (so no disagreement with the summarizer), the folder not valid, --strict fails."""
    runs = [SynthRun(0.0, 50.0), SynthRun(1.0, 80.0)]
    write_benchmark(tmp_path, "weak", runs)
    log = next(tmp_path.rglob("result_1.txt"))
    log.write_text("".join(ln for ln in log.read_text().splitlines(keepends=True) if '"key": "cache_clear"' not in ln))
    proc = run_cli(["report", str(tmp_path), "--strict", "--no-plots"], timeout=120)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "REJECTED result_1.txt (not scored): official compliance checker:" in proc.stdout
    assert "DISAGREEMENT" not in proc.stdout
    (g,) = json.loads((tmp_path / "report" / "report.json").read_text())["groups"]
    assert g["score"]["M_prime"] == 1 and g["score"]["ttta_min"] == pytest.approx(50.0 / 60.0)
    assert "cache_clear" in g["score"]["rejected"][0][1]
    assert not g["verdict"]["valid"]
    assert any(f.startswith("result_1.txt: rejected, not scored") for f in g["verdict"]["failures"])


def test_scaling_curve_when_several_scales(tmp_path: Path) -> None:
    for system, nodes in (("small", 1), ("big", 4)):
        write_benchmark(tmp_path, "weak", [SynthRun(0.0, 60.0 + nodes, nodes=nodes) for _ in range(2)], system=system)
    reps = build(tmp_path, tmp_path / "out", official=False).groups
    assert (tmp_path / "out" / "weak_cosmoflow_scaling.png").exists()
    assert {r.score.T for r in reps} == {2, 8}


def test_missing_or_empty_results_dir_is_a_clear_error(tmp_path: Path) -> None:
    proc = run_cli(["report", str(tmp_path / "nope")], timeout=60)
    assert proc.returncode == 2 and "does not exist" in proc.stderr
    proc = run_cli(["report", str(tmp_path)], timeout=60)
    assert proc.returncode == 2 and "no result_*.txt logs" in proc.stderr


def test_runs_with_different_auto_choices_are_noted(tmp_path: Path) -> None:
    """A weak set whose instances resolved channels-last "auto" differently (each probes for itself):
    the report says so, naming the runs, since their times compare different settings."""
    write_benchmark(tmp_path, "weak", [SynthRun(0.0, 50.0), SynthRun(1.0, 60.0)])
    for i, cl in enumerate((True, False)):
        log = next(tmp_path.rglob(f"result_{i}.txt"))
        rec = {"namespace": "", "time_ms": 1.0, "event_type": "POINT_IN_TIME", "key": "hpcbench_channels_last",
               "value": {"value": cl, "requested": "auto", "reason": "probe"}, "metadata": {}}
        log.write_text(f":::MLLOG {json.dumps(rec)}\n" + log.read_text())
    (rep,) = build(tmp_path, tmp_path / "out", official=False).groups
    (note,) = [n for n in rep.score.notes if "different channels_last" in n]
    assert "result_0.txt=True" in note and "result_1.txt=False" in note


def test_strong_runs_sharing_a_seed_are_flagged(tmp_path: Path) -> None:
    runs = [SynthRun(i * 1000.0, 300 + i, seed=1 if i < 2 else 10 + i) for i in range(4)]
    write_benchmark(tmp_path, "strong", runs, benchmark="cosmoflow")
    (rep,) = build(tmp_path, None).groups
    (flag,) = [f for f in rep.score.flags if "share a seed" in f]
    assert "seed 1: result_0.txt, result_1.txt" in flag and "result_2" not in flag
