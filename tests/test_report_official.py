"""`hpcbench report` against the official mlperf-logging tools on real and altered result sets:
convergence as the compliance checker defines it, bad and truncated logs, the division check,
TTTa as the summarizer computes it, the atomic report folder, and the package and
system-description checkers run as the command-line tools on a real 10-instance job."""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from hpcbench.common.mllog import MLPerfLogger
from conftest import TOY_OVERLAP, project_env, run_cli, run_mpi
from hpcbench import results_layout as rl
from hpcbench.report.build import build
from hpcbench.report.logs import parse_log
from hpcbench.report.targets import TARGETS
from mllog_synth import T0_MS, SynthRun, write_benchmark, write_log

TRAIN = ["-m", "hpcbench", "train", "tests.harness_toy:ToyWorkload", "--config", "tests/harness_configs/mini.toml",
         "--system-name", "toybox", "--no-progress", "--ranks-per-node", "1", "--device", "cpu"]


@pytest.fixture(scope="module")
def real_set(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real weak-scaling job: the harness trains 10 instances (1 rank each) under mpiexec (TOY_OVERLAP: long
    enough to overlap in time on a loaded box, as the report requires of one weak-scaling job)."""
    root = tmp_path_factory.mktemp("real10")
    proc = run_mpi(10, [*TRAIN, *TOY_OVERLAP, "--instances", "10", "--results", str(root)], timeout=300)
    assert proc.stdout.count(": success after") == 10, proc.stdout + proc.stderr
    return root


def _tool(args: list[str], cwd: Path) -> str:
    proc = subprocess.run([sys.executable, "-m", *args], cwd=cwd, capture_output=True, text=True, timeout=300)
    return proc.stdout + proc.stderr


def _set_last(path: Path, key: str, value: float | None = None, time_ms: float | None = None) -> None:
    """Edit the last MLLOG record of ``key`` in place (what a hand-altered log looks like)."""
    lines = path.read_text().splitlines(keepends=True)
    k = max(i for i, ln in enumerate(lines) if f'"key": "{key}"' in ln)
    rec = json.loads(lines[k].split(":::MLLOG ", 1)[1])
    if value is not None:
        rec["value"] = value
    if time_ms is not None:
        rec["time_ms"] = time_ms
    lines[k] = ":::MLLOG " + json.dumps(rec) + "\n"
    path.write_text("".join(lines))


def test_targets_are_the_official_checkers(tmp_path: Path) -> None:
    from mlperf_logging import compliance_checker

    base = Path(compliance_checker.__file__).parent / "hpc_3.0.0"
    for bench, tgt in TARGETS.items():
        for division in ("closed", "open"):
            rules = yaml.safe_load((base / f"{division}_{bench}.yaml").read_text())
            (rule,) = [r["KEY"] for r in rules if r.get("KEY", {}).get("NAME") == tgt.key]
            bounds = re.findall(r"v\['value'\]\s*(<=|>=|<|>)\s*([0-9.]+)", rule["ATLEAST_ONE_CHECK"])
            low = next((float(v), op == ">=") for op, v in bounds if op.startswith(">"))
            high = next((float(v), op == "<=") for op, v in bounds if op.startswith("<"))
            assert (tgt.low, tgt.low_inclusive, tgt.high, tgt.high_inclusive) == (*low, *high), (bench, division)


def test_real_ten_instance_job_passes_package_and_system_checkers(real_set: Path, tmp_path: Path) -> None:
    """The layout `hpcbench train` writes, checked by the official tools as a submitter would run them."""
    out = _tool(["mlperf_logging.package_checker", str(real_set), "hpc", "3.0.0",
                 "--log_output", str(tmp_path / "pc.log")], tmp_path)
    assert "PACKAGE CHECKER FOUND NO ERRORS" in out, out
    assert "Unknown files" not in out and "do not conform" not in out, out
    sysfile = rl.system_file(real_set, "toybox")
    out = _tool(["mlperf_logging.system_desc_checker", str(sysfile), "hpc", "3.0.0",
                 "--log_output", str(tmp_path / "sd.log")], tmp_path)
    assert "System description checker passed for toybox" in out, out
    assert json.loads(sysfile.read_text())["number_of_nodes"] == "10"  # strings, as the checker joins them
    # our own summary lives outside the folders the official tools read
    assert rl.summary_file(rl.benchmark_dir(real_set, "toybox", "weak", "cosmoflow")).is_file()
    proc = run_cli(["report", str(real_set), "--strict", "--no-plots"], timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "official package checker: passed" in proc.stdout
    assert "official system_desc_checker toybox.json: passed" in proc.stdout
    data = json.loads((real_set / "report" / "report.json").read_text())
    assert data["submission_checks"]["package_checker"]["ok"] is True
    (g,) = data["groups"]
    assert g["score"]["M_prime"] == 10 == g["official"]["number_of_models"]
    assert g["score"]["ttta_min"] == pytest.approx(g["official"]["score_min"], abs=1e-6)


def test_real_log_altered_to_miss_the_target_is_not_counted(real_set: Path, tmp_path: Path) -> None:
    """One real log keeps run_stop status=success but every eval_error is above 0.124 after the edit."""
    root = tmp_path / "altered"
    shutil.copytree(real_set, root, ignore=shutil.ignore_patterns("report"))
    log = rl.benchmark_dir(root, "toybox", "weak", "cosmoflow") / "result_3.txt"
    text = log.read_text()
    log.write_text(re.sub(r'("key": "eval_error", "value": )[0-9.e-]+', r"\g<1>0.13", text))
    assert parse_log(log).outcome == "target_missed"
    (g,) = build(root, tmp_path / "plots").groups
    assert g.score.M_prime == 9 and g.official is not None
    assert g.official.compliance["result_3.txt"][0] is False  # the official checker agrees
    assert not g.disagreements, g.disagreements
    # 9 < 10 converged cosmoflow models: the summarizer produced nothing, and the report says so
    assert not g.official.produced and "Not enough converging" in g.official.why_none
    assert next(c for c in g.checks if c.what == "TTTa (min)").official == "none produced"


def test_success_with_final_error_013_not_counted_agrees_with_summarizer(tmp_path: Path) -> None:
    """11 instances, one altered to a final eval_error of 0.13 (cosmoflow target 0.124): M' = 10 as
    the summarizer says, and models/min and TTTa leave it out."""
    runs = [SynthRun(0.1 * i, 60.0 + i, seed=i) for i in range(11)]
    runs[4] = SynthRun(0.4, 200.0, seed=4)  # the longest run: in TTTa only if (wrongly) counted
    folder = write_benchmark(tmp_path, "weak", runs)
    _set_last(folder / "result_4.txt", "eval_error", 0.13)
    report = build(tmp_path, tmp_path / "out")
    (g,) = report.groups
    assert g.score.M_prime == 10 == g.official.number_of_models
    assert g.score.ttta_min == pytest.approx(g.official.score_min, abs=1e-6)
    assert g.score.ttta_min == pytest.approx((0.1 * 10 + 70.0) / 60.0)  # result_10 ends last among the counted
    assert g.score.models_per_min == pytest.approx(10 / g.score.ttta_min)
    assert not g.disagreements, g.disagreements
    row = next(r for r in g.score.runs if r.name == "result_4.txt")
    assert row.status == "target_missed" and not row.converged
    assert any("no evaluation met the target eval_error <= 0.124 (last 0.13)" in p for p in row.problems)
    assert any(n.startswith("ours, not an MLPerf figure") for n in g.score.notes)
    assert (tmp_path / "out" / "testbox_weak_cosmoflow_quality.png").stat().st_size > 0


def test_truncated_and_garbage_logs_are_left_out_not_fatal(tmp_path: Path) -> None:
    """A killed instance's half-written last line and a non-MLLOG result_11.txt: named, left out,
    the rest scored; the official summarizer drops the same two files."""
    folder = write_benchmark(tmp_path, "weak", [SynthRun(0.1 * i, 60.0 + i, seed=i) for i in range(11)])
    killed = folder / "result_10.txt"
    text = killed.read_text()
    killed.write_text(text[: text.rindex(":::MLLOG") + 30])  # run_stop cut mid-line, no newline
    (folder / "result_11.txt").write_text("slurmstepd: error: *** JOB 42 CANCELLED ***\n")
    proc = run_cli(["report", str(tmp_path), "--strict"], timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (g,) = json.loads((tmp_path / "report" / "report.json").read_text())["groups"]
    s, off = g["score"], g["official"]
    (name, why), = s["skipped"]
    assert name == "result_11.txt" and "no readable ':::MLLOG' lines" in why and "result_11.txt" in proc.stdout
    runs = {r["name"]: r for r in s["runs"]}
    assert any("truncated last line" in p for p in runs["result_10.txt"]["problems"])
    assert (s["M"], s["M_prime"]) == (12, 10) and off["number_of_models"] == 10
    assert s["ttta_min"] == pytest.approx(off["score_min"], abs=1e-6)
    assert runs["result_10.txt"]["status"] == "unreadable"
    assert off["compliance"]["result_11.txt"] is False


def test_division_mismatch_is_flagged_and_fails_strict(tmp_path: Path) -> None:
    write_benchmark(tmp_path, "weak", [SynthRun(0.0, 50.0), SynthRun(1.0, 60.0)], division="open")
    sysfile = tmp_path / "systems" / "testbox.json"
    desc = json.loads(sysfile.read_text())
    sysfile.write_text(json.dumps({**desc, "division": "closed"}))
    proc = run_cli(["report", str(tmp_path), "--no-official", "--no-plots"], timeout=120)
    assert proc.returncode == 0 and "FLAG division mismatch" in proc.stdout, proc.stdout
    (g,) = json.loads((tmp_path / "report" / "report.json").read_text())["groups"]
    assert any("says 'closed' but the logs say 'open'" in f for f in g["score"]["flags"])
    proc = run_cli(["report", str(tmp_path), "--no-official", "--no-plots", "--strict"], timeout=120)
    assert proc.returncode == 1


def test_weak_job_whose_last_instance_aborted_passes_strict(tmp_path: Path) -> None:
    runs = [SynthRun(0.1 * i, 60.0 + i, seed=i) for i in range(10)]
    runs.append(SynthRun(1.0, 300.0, seed=10, status="aborted", final_error=0.5))
    write_benchmark(tmp_path, "weak", runs)
    proc = run_cli(["report", str(tmp_path), "--strict", "--no-plots"], timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (g,) = json.loads((tmp_path / "report" / "report.json").read_text())["groups"]
    s = g["score"]
    assert s["M_prime"] == 10 and s["ttta_min"] == pytest.approx(g["official"]["score_min"], abs=1e-6)
    assert s["job_span_min"] == pytest.approx(301.0 / 60.0)  # ours, with the aborted instance
    assert any("TTTa spans only the converged instances" in n for n in s["notes"])
    assert not any("their time is in TTTa" in n for n in s["notes"])


def test_time_consistency_checks(tmp_path: Path) -> None:
    folder = write_benchmark(tmp_path, "weak", [SynthRun(0.0, 10.0), SynthRun(100.0, 10.0)])
    _set_last(folder / "result_0.txt", "init_stop", time_ms=T0_MS + 5000.0)  # after run_start
    (g,) = build(tmp_path, None, official=False).groups
    assert any("result_0.txt: run_start is 5.000 s before init_stop" in f for f in g.score.flags)
    assert any("do not overlap in time: result_1.txt" in f for f in g.score.flags)


def test_samples_per_s_is_total_samples_over_total_time(tmp_path: Path) -> None:
    log = MLPerfLogger(tmp_path / "result_0.txt")
    for epoch, (t0, seconds, rate) in enumerate([(0.0, 1.0, 100.0), (2.0, 3.0, 300.0)], 1):
        log.start("epoch_start", metadata={"epoch_num": epoch}, time_ms=T0_MS + t0 * 1000)
        log.end("epoch_stop", metadata={"epoch_num": epoch}, time_ms=T0_MS + (t0 + seconds) * 1000)
        log.event("tracked_stats", {"throughput": rate}, metadata={"step": epoch}, time_ms=T0_MS + (t0 + seconds) * 1000)
    log.close()
    assert parse_log(tmp_path / "result_0.txt").samples_per_s == pytest.approx((100 + 900) / 4.0)  # not (100+300)/2


def test_report_folder_is_replaced_whole_or_removed(tmp_path: Path) -> None:
    write_log(tmp_path / "logs" / "result_0.txt", SynthRun(0.0, 30.0))
    out = tmp_path / "rep"
    assert run_cli(["report", str(tmp_path / "logs"), "--out", str(out), "--no-official"]).returncode == 0
    (out / "stale.png").write_bytes(b"old")
    assert run_cli(["report", str(tmp_path / "logs"), "--out", str(out), "--no-official"]).returncode == 0
    assert not (out / "stale.png").exists() and (out / "report.json").is_file()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".rep.")]  # no temporaries left
    (tmp_path / "logs" / "result_0.txt").unlink()  # nothing left to report on
    proc = run_cli(["report", str(tmp_path / "logs"), "--out", str(out), "--no-official"])
    assert proc.returncode == 2 and "no result_*.txt logs" in proc.stderr
    assert not out.exists() and "no report was produced" in proc.stdout
    assert (tmp_path / "rep.stale" / "report.json").is_file() and "moved to" in proc.stdout  # kept, marked stale
    write_log(tmp_path / "logs" / "result_0.txt", SynthRun(0.0, 30.0))
    env = project_env(MPLBACKEND="no-such-backend")  # an internal failure (plots), not bad input
    assert run_cli(["report", str(tmp_path / "logs"), "--out", str(out), "--no-official"]).returncode == 0
    proc = run_cli(["report", str(tmp_path / "logs"), "--out", str(out), "--no-official"], env=env)
    assert proc.returncode != 0 and "could not write the report" in proc.stderr and "Traceback" not in proc.stderr
    assert not out.exists() and (tmp_path / "rep.stale" / "report.json").is_file()
    (tmp_path / "logs" / "result_0.txt").unlink()
    mine = tmp_path / "notes"
    mine.mkdir()
    (mine / "keep.txt").write_text("mine")
    write_log(tmp_path / "logs" / "result_0.txt", SynthRun(0.0, 30.0))
    proc = run_cli(["report", str(tmp_path / "logs"), "--out", str(mine), "--no-official"])
    assert proc.returncode == 2 and "is not a report folder" in proc.stderr
    assert (mine / "keep.txt").read_text() == "mine"
