"""The report on logs hpcbench did not write and on benchmarks it has no workload for: the suite of every
benchmark the installed mlperf-logging defines (never "hpc" by default), one ruleset per folder (``--ruleset``,
the logs, hpcbench's default, the folder's benchmarks) and closed-readiness of foreign logs (what they do not
log is "not checked", a value the rules forbid still fails; unet3d's MXNet NAG; cache_clear as the references
log it). Synthetic folders only: real submissions were checked by hand (docs/report.md)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from conftest import run_cli
from hpcbench import registry
from hpcbench.common.benchmark import PARAMETERS_KEY
from hpcbench.common.errors import ConfigError
from hpcbench.report import unimplemented
from hpcbench.report.build import build
from hpcbench.report.closed import cache_clear_problem, is_hpcbench_log, not_checked, readiness
from hpcbench.report.discover import discover, parse_rulesets
from hpcbench.report.logs import parse_log
from mllog_synth import (SynthRun, TrainingBench, UNET3D, closed_ready, write_log, write_training_benchmark,
                         write_training_log)

LLAMA_LORA = TrainingBench("llama2_70b_lora", 173, {}, 8)  # no workload here; training 4.0.0 to 6.1.0
OTHER_PLACE = "/workspace/reference/train.py"  # where another submitter's logger says it logs from


def _checker() -> Path:
    from mlperf_logging import compliance_checker

    return Path(compliance_checker.__file__).parent


def _foreign(path: Path, drop: tuple[str, ...] = ()) -> Path:
    """``path`` as another submitter's logger writes it: no hpcbench_* or steps_per_epoch records, every record's
    metadata naming the reference's file; ``drop``: more keys left out."""
    out = []
    for ln in path.read_text().splitlines(keepends=True):
        rec = json.loads(ln.split(":::MLLOG ", 1)[1])
        if rec["key"].startswith("hpcbench_") or rec["key"] in ("steps_per_epoch", *drop):
            continue
        rec["metadata"] = {**rec.get("metadata", {}), "file": OTHER_PLACE}
        out.append(":::MLLOG " + json.dumps(rec) + "\n")
    path.write_text("".join(out))
    return path


def _set(path: Path, key: str, value: object) -> Path:
    """Give ``key``'s records the value ``value`` (JSON null for None)."""
    out = []
    for ln in path.read_text().splitlines(keepends=True):
        rec = json.loads(ln.split(":::MLLOG ", 1)[1])
        if rec["key"] == key:
            rec["value"] = value
        out.append(":::MLLOG " + json.dumps(rec) + "\n")
    path.write_text("".join(out))
    return path


# --- 5: every benchmark of the installed rules has its suite ---------------------------------------------------

def test_every_benchmark_the_installed_checker_defines_has_its_suite_and_run_count() -> None:
    """Read independently here from the checker's folders: each ``<suite>_<X.Y.Z>/closed_<b>.yaml`` whose
    closed_common.yaml accepts ``b``. llama2_70b_lora, stable_diffusion, gnn, ssd, gpt3, retinanet, rgat,
    llama31_405b and flux1 are training benchmarks (the old registry took each of them as hpc 3.0.0)."""
    from mlperf_logging.benchmark_meta import get_result_file_counts

    seen: dict[str, set[str]] = {}
    for folder in _checker().iterdir():
        suite, _, ruleset = folder.name.partition("_")
        if suite not in ("hpc", "training") or not (folder / "closed_common.yaml").exists() or "_" in ruleset:
            continue
        check = next(k["KEY"]["CHECK"] for k in yaml.safe_load((folder / "closed_common.yaml").read_text())
                     if k.get("KEY", {}).get("NAME") == "submission_benchmark")
        for f in folder.glob("closed_*.yaml"):
            b = f.stem.removeprefix("closed_")
            if f"'{b}'" in check:
                seen.setdefault(b, set()).add(suite)
                assert b in unimplemented.known_rulesets()[suite][ruleset], (b, suite, ruleset)
    for b in ("llama2_70b_lora", "stable_diffusion", "gnn", "ssd", "gpt3", "retinanet", "rgat", "llama31_405b",
              "flux1"):
        assert seen[b] == {"training"}
    for b, suites in seen.items():
        (suite,) = suites
        got_suite, ruleset = registry.suite_of(b)
        assert got_suite == suite == registry.known_suite(b), b
        assert b in unimplemented.known_rulesets()[suite][ruleset], (b, ruleset)
        counts = get_result_file_counts(suite)
        if b in counts:
            assert registry.required_runs(b) == counts[b], b
    assert registry.required_runs("llama2_70b_lora") == 10 and registry.suite_of("llama2_70b_lora") == ("training", "5.1.0")
    # optimizer variants are no benchmarks
    assert "resnet_lars" not in seen and "deepcam_lamb" not in seen
    assert registry.known_suite("deepcam_lamb") is None


def test_a_benchmark_no_suite_defines_is_an_error_not_hpc(tmp_path: Path) -> None:
    with pytest.raises(registry.UnknownBenchmark, match="'nosuchbench' is known to no suite"):
        registry.suite_of("nosuchbench")
    assert registry.known_suite("nosuchbench") is None
    # its logs are rejected, naming it, in every layout; the folder's suite is its layout's (training here)
    folder = tmp_path / "sub" / "results" / "box" / "nosuchbench"
    for k in range(3):
        write_log(folder / f"result_{k}.txt", SynthRun(k * 400.0, 300.0, seed=k), benchmark="nosuchbench")
    (g,) = discover(tmp_path / "sub")
    assert g.suite == "training"
    assert all(any("'nosuchbench' is known to no suite" in w for w in r.rejections) for r in g.runs)
    (g,) = discover(folder)  # loose: no suite taken on faith either
    assert all(r.rejected for r in g.runs)


def test_training_benchmark_without_a_workload_is_scored_by_the_training_tools(tmp_path: Path) -> None:
    """10 open llama2_70b_lora logs: checked and summarized as training 5.1.0 (the old report ran the hpc
    3.0.0 tools, whose checker raised FileNotFoundError on hpc_3.0.0/open_llama2_70b_lora.yaml for every log),
    a valid result on which hpcbench and the summarizer agree."""
    runs = [SynthRun(k * 1000.0, 600.0 + 10 * k, seed=k + 1) for k in range(10)]
    write_training_benchmark(tmp_path, runs, [0.92] * 10, division="open", bench=LLAMA_LORA)
    rep = build(tmp_path, None, official=True)
    (g,) = rep.groups
    assert (g.group.suite, g.group.ruleset, g.group.label) == ("training", "5.1.0", "training")
    assert g.official is not None and all(ok for ok, _ in g.official.compliance.values()), g.official.compliance
    assert g.score.required_runs == 10 and g.score.M_prime == 10
    assert g.official.produced and g.score.score_min == pytest.approx(g.official.score_min, abs=1e-6)
    assert rep.submission is not None and rep.submission.package is not None and rep.submission.package.ok
    assert g.verdict.valid, g.verdict.failures


# --- 6: one ruleset per folder, and where it came from --------------------------------------------------------

def _training_folder(root: Path, benches: list[str], runs: int = 1) -> Path:
    for b in benches:
        for k in range(runs):
            write_log(root / "results" / "box" / b / f"result_{k}.txt", SynthRun(k * 400.0, 300.0, seed=k),
                      benchmark=b, division="open")
    return root


def test_one_ruleset_per_folder_inferred_from_its_benchmarks(tmp_path: Path) -> None:
    """bert (hpcbench's default training 5.0.0), dlrm_dcnv2 (5.1.0) and resnet (4.0.0) in one submission, as
    NVIDIA's v4.0: the old report checked each under its own ruleset, and the summarizer crashed on the
    others' folders. Now one ruleset, 4.0.0, the newest that defines all three, and it says why."""
    groups = discover(_training_folder(tmp_path / "a", ["bert", "dlrm_dcnv2", "resnet"]))
    assert {(g.suite, g.ruleset) for g in groups} == {("training", "4.0.0")}
    assert all(g.ruleset_source.startswith("inferred: the newest installed training ruleset that defines every "
                                           "benchmark of the folder (bert, dlrm_dcnv2, resnet)") for g in groups)
    assert not any(r.rejected for g in groups for r in g.runs)
    # a single benchmark keeps hpcbench's default, and says so
    (g,) = discover(_training_folder(tmp_path / "b", ["bert"]))
    assert (g.ruleset, g.ruleset_source.split(";")[0]) == ("5.0.0", "hpcbench's default for bert")
    assert g.rules.startswith("training 5.0.0 (hpcbench's default for bert")
    (g,) = discover(_training_folder(tmp_path / "c", ["cosmoflow"]))  # in the training layout: still hpc
    assert (g.suite, g.ruleset) == ("hpc", "3.0.0")


def test_ruleset_option_wins_and_a_benchmark_it_does_not_define_is_rejected(tmp_path: Path) -> None:
    root = _training_folder(tmp_path, ["bert", "resnet"])
    groups = discover(root, parse_rulesets(["4.0.0"]))
    assert {(g.ruleset, g.ruleset_source) for g in groups} == {("4.0.0", "set by --ruleset")}
    groups = discover(root, parse_rulesets(["training=5.0.0", "hpc=3.0.0"]))
    resnet = next(g for g in groups if g.benchmark == "resnet")
    bert = next(g for g in groups if g.benchmark == "bert")
    assert resnet.ruleset == bert.ruleset == "5.0.0" and not any(r.rejected for r in bert.runs)
    (why,) = resnet.runs[0].rejections
    assert why.startswith("benchmark 'resnet' is not in training 5.0.0, the ruleset this folder is checked under "
                          "(set by --ruleset)") and "training 0.7.0" in why and why.endswith("4.0.0 define it")
    for bad, match in ((["9.9.9"], "no such ruleset"), (["gpu=4.0.0"], "unknown suite 'gpu'"),
                       (["4.0"], "expected a ruleset X.Y.Z"), (["4.0.0", "5.0.0"], "given twice")):
        with pytest.raises(ConfigError, match=match):
            parse_rulesets(bad)
    with pytest.raises(ConfigError, match="no hpc 4.0.0"):  # a plain ruleset for a suite that has no such round
        discover(_training_folder(tmp_path / "mixed", ["cosmoflow", "bert"]), parse_rulesets(["4.0.0"]))


def test_a_ruleset_the_logs_name_is_used(tmp_path: Path) -> None:
    root = tmp_path / "sub"
    for k in range(2):
        write_log(root / "results" / "box" / "bert" / f"result_{k}.txt", SynthRun(k * 400.0, 300.0, seed=k),
                  benchmark="bert", extra={"hpcbench_ruleset": {"value": "training 4.1.0"}})
    (g,) = discover(root)
    assert (g.ruleset, g.ruleset_source) == ("4.1.0", "named by the logs (hpcbench_ruleset)")
    (g,) = discover(root, parse_rulesets(["training=4.0.0"]))
    assert g.ruleset == "4.0.0"
    for f in root.rglob("result_*.txt"):  # a ruleset the installed package lacks is not taken
        f.write_text(f.read_text().replace("training 4.1.0", "9.9.9"))
    (g,) = discover(root)
    assert g.ruleset == "5.0.0" and "the logs name 9.9.9, which the installed mlperf-logging does not have" in g.rules


def test_cli_prints_the_rules_and_their_source(tmp_path: Path) -> None:
    root = _training_folder(tmp_path, ["bert", "resnet"], runs=2)
    proc = run_cli(["report", str(root), "--no-official", "--no-plots", "--ruleset", "4.0.0"], timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "rules: training 4.0.0 (set by --ruleset)" in proc.stdout
    data = json.loads((root / "report" / "report.json").read_text())
    assert {json.dumps(g["rules"], sort_keys=True) for g in data["groups"]} == {json.dumps(
        {"suite": "training", "ruleset": "4.0.0", "source": "set by --ruleset"}, sort_keys=True)}
    proc = run_cli(["report", str(root), "--no-official", "--no-plots", "--ruleset", "hpc=7.0.0"], timeout=120)
    assert proc.returncode != 0 and "no such ruleset" in proc.stdout + proc.stderr


# --- 7: closed-readiness of logs hpcbench did not write -------------------------------------------------------

def _closed_cosmoflow(tmp_path: Path, name: str = "result_0.txt") -> Path:
    return write_log(tmp_path / name, SynthRun(0.0, 300.0), division="closed", extra=closed_ready("cosmoflow"))


def test_an_hpcbench_log_is_recognized(tmp_path: Path) -> None:
    ours = parse_log(_closed_cosmoflow(tmp_path))
    assert is_hpcbench_log(ours)
    bare = _closed_cosmoflow(tmp_path, "result_1.txt")
    _foreign(bare)
    assert not is_hpcbench_log(parse_log(bare))
    # without any hpcbench_* record, hpcbench's logger still names itself in the submission_* records
    stripped = _closed_cosmoflow(tmp_path, "result_2.txt")
    stripped.write_text("".join(ln for ln in stripped.read_text().splitlines(keepends=True) if "hpcbench_" not in ln))
    assert is_hpcbench_log(parse_log(stripped))


def test_foreign_closed_log_without_hpcbench_keys_is_closed_ready_with_what_was_not_checked(tmp_path: Path) -> None:
    """Dell's HPC v3.0-era deepcam and NVIDIA's v4.0 bert logs: correct values, no hpcbench_model_parameters
    (only hpcbench logs it), bert's opt_name and max_sequence_length not logged (its closed YAML does not ask
    for them). The old report called every such log not closed-ready."""
    path = _foreign(_closed_cosmoflow(tmp_path), drop=("opt_momentum",))
    run = parse_log(path)
    assert readiness(run, "closed", None) == []
    items = not_checked(run, "closed", None)
    assert items[0].startswith(f"model: parameter count not checked (not an hpcbench log: only hpcbench logs "
                               f"{PARAMETERS_KEY}; the closed cosmoflow model has 8,907,556)")
    assert "hyperparameter: opt_momentum not checked: not logged (not an hpcbench log); the closed rules fix it to 0.9" in items
    # a value the closed rules forbid still fails a foreign log
    bad = _set(_foreign(_closed_cosmoflow(tmp_path, "result_1.txt")), "opt_momentum", 0.5)
    assert readiness(parse_log(bad), "closed", None) == ["hyperparameter: opt_momentum is 0.5; the closed rules fix "
                                                         "it to 0.9"]
    # hpcbench's own log is held to all of it
    own = _closed_cosmoflow(tmp_path, "result_2.txt")
    own.write_text("".join(ln for ln in own.read_text().splitlines(keepends=True)
                           if PARAMETERS_KEY not in ln and '"opt_momentum"' not in ln))
    reasons = readiness(parse_log(own), "closed", None)
    assert [r.split(";")[0] for r in reasons] == [f"model: no parameter count logged ({PARAMETERS_KEY})",
                                                  "hyperparameter: opt_momentum is not logged"]
    assert not_checked(parse_log(own), "closed", None) == []


def test_foreign_log_of_a_benchmark_without_a_closed_definition_is_not_checked(tmp_path: Path) -> None:
    path = _foreign(write_training_log(tmp_path / "result_0.txt", SynthRun(0.0, 300.0), 0.92, "closed",
                                       bench=LLAMA_LORA))
    run = parse_log(path)
    assert readiness(run, "closed", None) == []
    assert not_checked(run, "closed", None) == ["model, dataset and hyperparameters: not checked (hpcbench has no "
                                                "closed definition of 'llama2_70b_lora'; not an hpcbench log)"]


def test_unet3d_nag_is_an_allowed_closed_optimizer(tmp_path: Path) -> None:
    """training_rules.adoc's compliant optimizers for image segmentation: torch.optim.SGD, TF's momentum
    optimizer and MXNet's mx.optimizer.NAG (NVIDIA's v4.0 unet3d logs opt_name 'nag')."""
    c = registry.entry("unet3d").closed
    assert c is not None
    extra = {PARAMETERS_KEY: {"value": c.parameters[0]}, **c.fixed, "train_samples": 168, "eval_samples": 42}
    for name, opt in (("result_0.txt", "nag"), ("result_1.txt", "NAG"), ("result_2.txt", "sgd")):
        path = write_training_log(tmp_path / name, SynthRun(0.0, 300.0), 0.91, "closed", bench=UNET3D,
                                  extra={**extra, "opt_name": opt})
        assert readiness(parse_log(path), "closed", None) == [], opt
    path = write_training_log(tmp_path / "result_3.txt", SynthRun(0.0, 300.0), 0.91, "closed", bench=UNET3D,
                              extra={**extra, "opt_name": "adam"})
    assert readiness(parse_log(path), "closed", None) == ["hyperparameter: opt_name is 'adam'; the closed rules fix "
                                                          "it to 'sgd' or 'nag'"]


@pytest.mark.parametrize("value,ours,want", [
    (True, True, None), (True, False, None),
    (None, False, None),  # the HPC references: log_event(key="cache_clear"), no value
    (None, True, "logged cache_clear None, not true"),  # hpcbench logs true or false
    (False, False, "logged cache_clear false"), (False, True, "logged cache_clear false"),
    ("absent", False, "logged no cache_clear record"),
])
def test_cache_clear_as_the_rules_and_the_references_log_it(tmp_path: Path, value: object, ours: bool,
                                                            want: str | None) -> None:
    path = _closed_cosmoflow(tmp_path)
    if not ours:
        _foreign(path)
    if value == "absent":
        path.write_text("".join(ln for ln in path.read_text().splitlines(keepends=True) if '"cache_clear"' not in ln))
    else:
        _set(path, "cache_clear", value)
    got = cache_clear_problem(parse_log(path))
    assert (got is None) if want is None else (got is not None and got.startswith(want)), got


def test_real_shaped_foreign_closed_folder_is_valid(tmp_path: Path) -> None:
    """A closed cosmoflow folder of ten foreign logs (no hpcbench_* records, right values) is closed-ready, and
    the report lists, per log, what it could not check."""
    from hpcbench.report.closed import closed_not_checked
    from mllog_synth import write_benchmark

    runs = [SynthRun(k * 400.0, 300.0 + k, seed=k + 1) for k in range(10)]
    folder = write_benchmark(tmp_path, "strong", runs, division="closed", extra=closed_ready("cosmoflow"))
    for f in folder.glob("result_*.txt"):
        _foreign(f)
    rep = build(tmp_path, None, official=False)
    (g,) = rep.groups
    assert g.score.closed and not g.score.not_closed_ready
    missing = closed_not_checked(g.group, g.score)
    assert sorted(missing) == [f"result_{k}.txt" for k in range(10)]
    assert all(items[0].startswith("model: parameter count not checked") for items in missing.values())


def test_the_valid_label_of_a_foreign_closed_folder_says_what_was_not_checked() -> None:
    """A closed folder judged valid whose logs hpcbench did not write: the label says some closed items were not
    checked in them (was: it claimed every log's parameter count, sample counts and fixed values were compared)."""
    from hpcbench.report.compare import verdict
    from hpcbench.report.scoring import Score

    score = Score(system="box", mode="strong", benchmark="cosmoflow", suite="hpc", ruleset="3.0.0", division="closed",
                  required_runs=0, runs=[])
    score.closed, score.score_min = True, 1.0
    ok = verdict(score, None, None, [], unchecked=0)
    assert not ok.valid  # no official tools: the label is the failing list; the scope is built for valid ones only
    from hpcbench.report.official import Official, SubmissionChecks, ToolRun

    off = Official(produced=True, score_min=1.0)
    sub = SubmissionChecks(Path("."))
    sub.package = ToolRun(["package_checker"], True, "PACKAGE CHECKER FOUND NO ERRORS")
    full = verdict(score, off, sub, [], unchecked=0)
    part = verdict(score, off, sub, [], unchecked=10)
    assert full.valid and part.valid, (full.label, part.label)
    assert "not checked" not in full.label and "in 10 log(s) hpcbench did not write" in part.label
