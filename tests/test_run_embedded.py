"""`hpcbench run`, the README's main command, end to end on the embedded default."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import run_cli


@pytest.mark.slow
def test_run_embedded_default_reaches_target_and_reports(tmp_path: Path) -> None:
    work = tmp_path / "work"
    proc = run_cli(["run", "--workdir", str(work)], timeout=900)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert "hpcbench run finished" in proc.stdout
    logs = sorted((work / "results" / "results").rglob("result_*.txt"))
    assert [p.name for p in logs] == ["result_0.txt", "result_1.txt"]
    assert all(p.parent.parent.name == "weak" for p in logs)  # results/<system>/weak/cosmoflow/
    report = json.loads((work / "results" / "report" / "report.json").read_text())
    (group,) = report["groups"]
    score = group["score"]
    assert (score["mode"], score["benchmark"], score["division"]) == ("weak", "cosmoflow", "open")
    assert [r["status"] for r in score["runs"]] == ["success", "success"]
    assert all(r["final_metric"] <= 0.124 and r["staging_s"] > 0 for r in score["runs"])
    assert score["M_prime"] == 2 and score["T"] == 2 and score["S"] == 1
    assert score["models_per_min"] == pytest.approx(2 / score["ttta_min"])
    official = group["official"]
    assert official["compliance"] == {"result_0.txt": True, "result_1.txt": True}
    # 2 < 10 converged cosmoflow models: the official summarizer scores nothing, and the report says so
    assert official["produced"] is False and "Not enough converging" in official["why_none"]
    assert report["submission_checks"]["system_desc_checker"]  # the official checkers ran on the folder
    assert list((work / "results" / "report").glob("*timeline.png"))
    # the packed shards are what staging read; the node-local copies hold every original file
    manifest = json.loads((work / "packed" / "manifest.json").read_text())
    assert manifest
    staged = sorted(p.name for p in (work / "local" / "node0" / "train").iterdir() if not p.name.startswith("."))
    raw = sorted(p.name for p in (work / "raw" / "train").iterdir() if not p.name.startswith("."))
    assert staged == raw and len(raw) == 4096


@pytest.mark.slow
def test_run_dlrm_dcnv2_end_to_end_in_the_training_layout(tmp_path: Path) -> None:
    """datagen -> pack -> stage (every node gets every day file) -> 2 instances of the mini preset ->
    report, in the training suite's layout results/<system>/dlrm_dcnv2/."""
    work = tmp_path / "work"
    proc = run_cli(["run", "--workload", "dlrm_dcnv2", "--workdir", str(work), "--device", "cpu"], timeout=900)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    logs = sorted((work / "results" / "results").rglob("result_*.txt"))
    assert [p.name for p in logs] == ["result_0.txt", "result_1.txt"]
    assert all(p.parent.name == "dlrm_dcnv2" and p.parent.parent.parent.name == "results" for p in logs)
    report = json.loads((work / "results" / "report" / "report.json").read_text())
    (group,) = report["groups"]
    score = group["score"]
    assert (score["suite"], score["ruleset"], score["benchmark"], score["division"]) == \
        ("training", "5.1.0", "dlrm_dcnv2", "open")
    assert all(r["status"] == "success" and r["final_metric"] >= 0.77 and r["staging_s"] > 0 for r in score["runs"])
    assert group["official"]["compliance"] == {"result_0.txt": True, "result_1.txt": True}
    assert not [c for c in group["checks"] if c["agree"] is False]
    staged = sorted(p.name for p in (work / "local" / "node0").iterdir() if not p.name.startswith("."))
    assert staged == sorted(p.name for p in (work / "raw").iterdir() if p.name.startswith("day_"))


@pytest.mark.slow
def test_run_bert_end_to_end_in_the_training_layout(tmp_path: Path) -> None:
    """datagen (packed train shards, padded eval shard) -> pack -> stage -> 2 instances of the mini
    preset -> report, in results/<system>/bert/, checked and scored under training 5.0.0."""
    work = tmp_path / "work"
    proc = run_cli(["run", "--workload", "bert", "--workdir", str(work), "--device", "cpu"], timeout=900)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    logs = sorted((work / "results" / "results").rglob("result_*.txt"))
    assert [p.name for p in logs] == ["result_0.txt", "result_1.txt"]
    assert all(p.parent.name == "bert" and p.parent.parent.parent.name == "results" for p in logs)
    report = json.loads((work / "results" / "report" / "report.json").read_text())
    (group,) = report["groups"]
    score = group["score"]
    assert (score["suite"], score["ruleset"], score["benchmark"], score["division"]) == \
        ("training", "5.0.0", "bert", "open")
    assert all(r["status"] == "success" and r["final_metric"] >= 0.65 and r["staging_s"] > 0 for r in score["runs"])
    assert group["official"]["compliance"] == {"result_0.txt": True, "result_1.txt": True}
    assert not [c for c in group["checks"] if c["agree"] is False]
    staged = sorted(p.name for p in (work / "local" / "node0" / "train").iterdir() if not p.name.startswith("."))
    assert staged == sorted(p.name for p in (work / "raw" / "train").iterdir() if not p.name.startswith("."))
