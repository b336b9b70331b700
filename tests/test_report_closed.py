"""Closed-readiness in the report: every log of a folder that claims the closed division is compared with the
benchmark's closed definition (the record's ``closed``: parameter count, real dataset sample counts, fixed
hyperparameters) and the divisions of the log, the system JSON and the folder; a folder is "a valid closed
result" only when every official tool passes, every log is closed-ready and the run count is met."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from conftest import run_mpi
from hpcbench import registry
from hpcbench.common.benchmark import PARAMETERS_KEY, ClosedDefinition
from hpcbench.common.mllog import check_log
from hpcbench.common.workload import DataSizes
from hpcbench.report.build import build
from hpcbench.report.closed import folder_division, readiness, same_value
from hpcbench.report.logs import parse_log
from mllog_synth import SynthRun, closed_ready, write_benchmark, write_log

TIMES = [300, 320, 310, 350, 330]
COSMO = registry.entry("cosmoflow").closed
assert COSMO is not None


@pytest.mark.parametrize("name", registry.names())
def test_each_closed_definition_is_what_the_full_preset_builds_and_logs(name: str) -> None:
    """The record's closed definition against the workload's own `full` preset: the model built on the meta
    device has one of its parameter counts, and every fixed hyperparameter is logged with its value."""
    cls = registry.get(name)
    c = cls.record.closed
    assert isinstance(c, ClosedDefinition) and c.parameters and c.source
    cfg = cls.load_config("full")
    wl = cls(cfg)
    assert cfg.train.division == "closed"
    cfg.train.division = "open"  # BERT's closed model starts from the phase-1 checkpoint (not here): count the
    with torch.device("meta"):  # architecture alone; its load is tested in test_bert_checkpoint.py
        model = wl.build_model()
    cfg.train.division = "closed"
    assert sum(p.numel() for p in {id(p): p for p in model.parameters()}.values()) == c.parameters[0]
    wl.sizes = DataSizes(train_samples=4000, eval_samples=10, steps_per_epoch=100, local_batch_size=4)
    logged = wl.hyperparameters()
    fixed = c.fixed_for(logged.get("opt_name"))
    assert fixed, name  # every benchmark fixes at least one value
    for key, want in fixed.items():
        assert key in logged and same_value(logged[key], want), (name, key, logged.get(key), want)


def _ready_log(tmp_path: Path, benchmark: str = "cosmoflow", **over: object) -> Path:
    keys = {**closed_ready(benchmark), **over}
    return write_log(tmp_path / "result_0.txt", SynthRun(0.0, 300.0), benchmark=benchmark, division="closed",
                     extra={k: v for k, v in keys.items() if v is not None})


def _drop(path: Path, key: str) -> None:
    path.write_text("".join(ln for ln in path.read_text().splitlines(keepends=True) if f'"key": "{key}"' not in ln))


def test_a_closed_ready_log_has_no_reason(tmp_path: Path) -> None:
    run = parse_log(_ready_log(tmp_path))
    assert readiness(run, "closed", None) == []
    assert readiness(run, "closed", "closed") == []


@pytest.mark.parametrize("case,want", [
    ("log_open", "division: the log's submission_division is 'open', not 'closed'"),
    ("system_open", "division: systems/<system>.json says 'open', not 'closed'"),
    ("system_missing", "division: systems/<system>.json states no division (missing or unreadable)"),
    ("folder_open", "division: the submission folder is under open/, not closed/"),
    ("params_missing", f"model: no parameter count logged ({PARAMETERS_KEY}); the closed cosmoflow model has 8,907,556"),
    ("params_wrong", f"model: {PARAMETERS_KEY} is 1,234; the closed cosmoflow model has 8,907,556 parameters"),
    ("train_wrong", "dataset: train_samples is 64; the real cosmoflow dataset has 524,288 (a subset"),
    ("eval_missing", "dataset: eval_samples is not logged; the real cosmoflow dataset has 65,536"),
    ("fixed_wrong", "hyperparameter: opt_momentum is 0.5; the closed rules fix it to 0.9"),
    ("fixed_missing", "hyperparameter: opt_momentum is not logged; the closed rules fix it to 0.9"),
    ("no_definition", "no closed definition of benchmark 'hpcbench_unknown' is known to hpcbench"),
])
def test_each_reason(tmp_path: Path, case: str, want: str) -> None:
    system, folder = "closed", None
    if case == "log_open":
        path = write_log(tmp_path / "result_0.txt", SynthRun(0.0, 300.0), division="open", extra=closed_ready("cosmoflow"))
    elif case == "no_definition":
        path = write_log(tmp_path / "result_0.txt", SynthRun(0.0, 300.0), benchmark="hpcbench_unknown",
                         division="closed")
    else:
        path = _ready_log(tmp_path, **{"params_wrong": {PARAMETERS_KEY: {"value": 1234}},
                                       "train_wrong": {"train_samples": 64},
                                       "fixed_wrong": {"opt_momentum": 0.5}}.get(case, {}))
    if case == "params_missing":
        _drop(path, PARAMETERS_KEY)
    elif case == "eval_missing":
        _drop(path, "eval_samples")
    elif case == "fixed_missing":
        _drop(path, "opt_momentum")
    elif case == "system_open":
        system = "open"
    elif case == "system_missing":
        system = None
    elif case == "folder_open":
        folder = "open"
    reasons = readiness(parse_log(path), system, folder)
    assert len(reasons) == 1 and reasons[0].startswith(want), reasons


def test_fixed_values_per_optimizer_and_value_comparison(tmp_path: Path) -> None:
    """ResNet's fixed keys depend on opt_name (lars_* or sgd_*); a float logged for an integer is the same
    number, strings compare without case, lists element by element."""
    resnet = registry.entry("resnet").closed
    assert resnet is not None
    assert resnet.fixed_for("LARS")["lars_epsilon"] == 0.0 and "sgd_opt_momentum" in resnet.fixed_for("sgd")
    assert resnet.fixed_for(None) == {}
    assert same_value(2.0, 2) and same_value("SGD", "sgd") and same_value([128, 128, 128], [128, 128, 128])
    assert not same_value([128, 128], [128, 128, 128]) and not same_value("0.9", 0.9) and not same_value(True, 1)
    run = parse_log(_ready_log(tmp_path))
    run.benchmark, run.values["opt_name"] = "resnet", "lars"
    run.settings["model_parameters"] = 25_557_032
    run.values.update(train_samples=1_281_167, eval_samples=50_000, lars_opt_end_learning_rate=0.0001,
                      lars_opt_learning_rate_decay_poly_power=2.0, lars_epsilon=1e-9)
    assert readiness(run, "closed", None) == ["hyperparameter: lars_epsilon is 1e-09; the closed rules fix it to 0.0"]


def test_folder_division_is_mlperfs_package_layout(tmp_path: Path) -> None:
    bench = tmp_path / "closed" / "org" / "results" / "box" / "strong" / "cosmoflow"
    assert folder_division(bench) == "closed"
    assert folder_division(tmp_path / "open" / "results" / "box" / "deepcam") == "open"
    assert folder_division(tmp_path / "sub" / "results" / "box" / "strong" / "cosmoflow") is None
    assert folder_division(tmp_path / "loose") is None


def _strong(root: Path, n: int, extra: dict[str, object] | None) -> Path:
    """Closed cosmoflow runs the package checker's RCP check accepts: global batch 32 (an RCP of hpc 3.0.0),
    converged at epoch 9 (the RCP's runs take 8 or 9)."""
    return write_benchmark(root, "strong", [SynthRun(i * 1000.0, TIMES[i % 5] + i, seed=i + 1, epochs=9)
                                            for i in range(n)], division="closed",
                           extra=None if extra is None else {**extra, "global_batch_size": 32})


def test_closed_folder_is_valid_only_when_every_log_is_closed_ready(tmp_path: Path) -> None:
    """Ten closed-ready cosmoflow runs pass every official tool and are a valid closed result; one log of a
    smaller dataset turns the verdict, naming that log and why, while the official tools still pass."""
    folder = _strong(tmp_path, 10, closed_ready("cosmoflow"))
    (g,) = build(tmp_path, None).groups
    assert g.score.closed and not g.score.not_closed_ready
    assert g.verdict.valid, g.verdict.failures
    assert g.verdict.label.startswith("yes (a valid closed result")
    log = folder / "result_3.txt"
    log.write_text(log.read_text().replace('"key": "train_samples", "value": 524288',
                                           '"key": "train_samples", "value": 4096'))
    (g,) = build(tmp_path, None).groups
    assert g.official is not None and g.official.produced and all(ok for ok, _ in g.official.compliance.values())
    assert not g.verdict.valid
    assert g.verdict.failures == ["result_3.txt: not closed-ready (dataset: train_samples is 4,096; the real cosmoflow "
                                  "dataset has 524,288 (a subset, another data.size or synthetic data?))"]
    row = next(r for r in g.score.runs if r.name == "result_3.txt")
    assert row.closed_ready is False and all(r.closed_ready for r in g.score.runs if r is not row)


def test_open_folder_is_not_judged_closed_and_a_closed_system_json_is(tmp_path: Path) -> None:
    write_benchmark(tmp_path, "strong", [SynthRun(i * 1000.0, 300.0 + i, seed=i) for i in range(5)])
    (g,) = build(tmp_path, None, official=False).groups
    assert not g.score.closed and all(r.closed_reasons is None for r in g.score.runs)
    sysf = tmp_path / "systems" / "testbox.json"
    sysf.write_text(json.dumps({**json.loads(sysf.read_text()), "division": "closed"}))
    (g,) = build(tmp_path, None, official=False).groups
    assert g.score.closed  # the system JSON claims closed: the open logs are judged, and fail
    assert all(any(w.startswith("division: the log's submission_division is 'open'") for w in r.closed_reasons or [])
               for r in g.score.runs)


def test_a_folder_under_open_with_closed_logs_is_flagged(tmp_path: Path) -> None:
    root = tmp_path / "open" / "org"
    _strong(root, 5, closed_ready("cosmoflow"))
    (g,) = build(root, None, official=False).groups
    assert g.score.folder_division == "open"
    assert any(f.startswith("division mismatch: the submission folder is under open/") for f in g.score.flags)
    assert all("division: the submission folder is under open/, not closed/" in (r.closed_reasons or [])
               for r in g.score.runs)


TOY = ["-m", "hpcbench", "train", "tests.harness_toy:ToyWorkload", "--config", "tests/harness_configs/mini.toml",
       "--system-name", "toybox", "--no-progress", "--ranks-per-node", "1", "--device", "cpu"]


def test_a_closed_labelled_toy_run_is_not_closed_ready(tmp_path: Path) -> None:
    """A real harness run of the toy model (it claims cosmoflow's rules) labelled closed: the official closed
    checker passes its log (the harness's parameter-count line included), the report says "not closed-ready"
    with its reasons and never calls the folder a valid closed result."""
    run_mpi(1, [*TOY, "--results", str(tmp_path), "--set", "train.division=closed", "--set", "train.target=0.124"],
            timeout=240)
    (log,) = sorted(tmp_path.glob("results/toybox/strong/cosmoflow/result_*.txt"))
    ok, out = check_log(log)
    assert ok, out
    n = parse_log(log).settings["model_parameters"]
    assert isinstance(n, int) and 0 < n < COSMO.parameters[0]
    (g,) = build(tmp_path, None).groups
    assert g.score.closed and g.score.system_division == "closed"
    (row,) = g.score.runs
    assert row.closed_ready is False
    assert any(w.startswith(f"model: {PARAMETERS_KEY} is {n:,}; the closed cosmoflow model has 8,907,556") for w in row.closed_reasons or [])
    assert any(w.startswith("dataset: train_samples is ") for w in row.closed_reasons or [])
    assert any(w.startswith("dataset: eval_samples is ") for w in row.closed_reasons or [])
    assert not g.verdict.valid
    assert any(f.startswith(f"{row.name}: not closed-ready (model: ") for f in g.verdict.failures)
    from conftest import run_cli

    proc = run_cli(["report", str(tmp_path), "--no-plots", "--strict"], timeout=180)
    assert proc.returncode == 1 and f"NOT CLOSED-READY {row.name}: model: " in proc.stdout, proc.stdout
    assert "1 log(s) of closed folders not closed-ready" in proc.stdout


def test_parameter_count_of_a_model_parallel_model_sums_the_shards() -> None:
    """What the harness logs: replicated parameters once, model-parallel ones summed over the ranks."""
    from types import SimpleNamespace

    from hpcbench.common.build import parameter_count

    model = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.Linear(2, 1))  # 8 + 3 parameters

    class Comm:
        def allreduce(self, n: int) -> int:
            return 4 * n  # four ranks, each with its own shard of the same size

    wl = SimpleNamespace(local_parameters=lambda m: [m[1].weight])
    parts = SimpleNamespace(model=model, parallel=SimpleNamespace(comm=Comm()))
    assert parameter_count(wl, parts) == 8 + 1 + 4 * 2  # type: ignore[arg-type]
    parts.parallel.comm = None
    assert parameter_count(wl, parts) == 11  # type: ignore[arg-type]


# --- weak scaling: failed instances ------------------------------------------------------------------------


def _weak(root: Path, failed: tuple[int, ...], n: int = 12) -> Path:
    """A weak-scaling cosmoflow job of ``n`` concurrent instances; those in ``failed`` ran to the end without
    meeting the target (run_stop aborted)."""
    runs = [SynthRun(0.1 * i, 60.0 + i, seed=i, final_error=0.3 if i in failed else 0.1,
                     status="aborted" if i in failed else "success") for i in range(n)]
    return write_benchmark(root, "weak", runs)


def test_prune_failed_moves_failed_instances_aside_and_the_package_checker_then_accepts(tmp_path: Path) -> None:
    from conftest import run_cli

    folder = _weak(tmp_path, failed=(3, 7))
    (folder / "result_12.txt").write_text("srun: error: node12: task 0: Killed\n")  # a killed instance's file
    rep = build(tmp_path, None)
    (g,) = rep.groups
    assert g.score.M_prime == 10 and not g.verdict.valid
    assert rep.submission is not None and rep.submission.package is not None
    assert rep.submission.package.ok is False  # three non-compliant files: the package checker rejects the folder
    assert ("weak scaling: 3 failed instance log(s) left in the folder (result_3.txt aborted, result_7.txt aborted, "
            "result_12.txt unreadable)") in " ".join(g.verdict.failures)
    proc = run_cli(["report", str(tmp_path), "--no-plots", "--prune-failed"], timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    aside = tmp_path / "hpcbench" / "testbox" / "weak" / "cosmoflow" / "pruned_failed"
    for name, why in (("result_3.txt", "aborted"), ("result_7.txt", "aborted"), ("result_12.txt", "unreadable")):
        assert f"pruned {folder / name} -> {aside / name} ({why})\n" in proc.stdout, proc.stdout
        assert (aside / name).is_file() and not (folder / name).exists()
    assert "moved 3 log(s) aside (nothing deleted)" in proc.stdout
    assert "official package checker: passed" in proc.stdout, proc.stdout
    rep = json.loads((tmp_path / "report" / "report.json").read_text())
    (grp,) = rep["groups"]
    assert grp["verdict"]["valid"], grp["verdict"]["failures"]
    assert grp["score"]["M"] == 10 and grp["score"]["M_prime"] == 10
    proc = run_cli(["report", str(tmp_path), "--no-plots", "--no-official", "--prune-failed"], timeout=120)
    assert "no failed weak-scaling instance log to move" in proc.stdout


def test_prune_refuses_to_overwrite_and_leaves_rejected_and_strong_logs(tmp_path: Path) -> None:
    from hpcbench.common.errors import ConfigError
    from hpcbench.report.prune import PRUNED, prune_failed

    folder = _weak(tmp_path, failed=(1,), n=4)
    dup = folder / "result_2.txt"
    dup.write_text(dup.read_text() * 2)  # rejected (two runs in one file): not a failed instance
    strong = write_benchmark(tmp_path, "strong", [SynthRun(0.0, 60.0, final_error=0.3, status="aborted")])
    aside = tmp_path / "hpcbench" / "testbox" / "weak" / "cosmoflow" / PRUNED
    aside.mkdir(parents=True)
    (aside / "result_1.txt").write_text("from an earlier job\n")
    with pytest.raises(ConfigError, match="result_1.txt already exist.*Nothing was moved"):
        prune_failed(tmp_path)
    assert (folder / "result_1.txt").is_file() and (aside / "result_1.txt").read_text() == "from an earlier job\n"
    (aside / "result_1.txt").unlink()
    moved, kept = prune_failed(tmp_path)
    assert [(m.source.name, m.why) for m in moved] == [("result_1.txt", "aborted")]
    assert [p.name for p, _ in kept] == ["result_2.txt"] and "second run_start" in kept[0][1]
    assert dup.is_file() and (strong / "result_0.txt").is_file()  # strong runs count as runs: never pruned
    (g_strong, g_weak) = sorted(build(tmp_path, None, official=False).groups, key=lambda g: g.score.mode)
    assert not any(f.startswith("weak scaling:") for f in g_weak.verdict.failures)  # nothing failed is left
    assert any(f.startswith("result_2.txt: rejected") for f in g_weak.verdict.failures)  # the rejected log still counts
    assert not any(f.startswith("weak scaling:") for f in g_strong.verdict.failures)
    with pytest.raises(ConfigError, match="not a submission folder"):
        prune_failed(folder)


def test_the_closed_readiness_table_is_the_records() -> None:
    """docs/closed.md, "Closed-readiness in the report": one row per registered workload, its parameter counts and
    sample counts those of the record's ClosedDefinition ("not pinned" where it holds none), and every fixed key of
    the record named in the row (OpenFold's counted)."""
    import re

    text = (Path(__file__).resolve().parents[1] / "docs" / "closed.md").read_text()
    section = text.split("## Closed-readiness in the report", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 6 and cells[0] not in ("workload", "---"):
            rows[cells[0]] = cells

    def number(cell: str) -> int | None:
        return None if cell.startswith("not pinned") else int(cell.replace(",", ""))

    assert set(rows) == set(registry.names())
    for name, (_, params, train, evaluate, fixed, _) in rows.items():
        closed = registry.get(name).record.closed
        assert tuple(int(p.replace(",", "")) for p in params.split(" or ")) == closed.parameters, name
        assert (number(train), number(evaluate)) == (closed.train_samples, closed.eval_samples), name
        if name == "openfold":
            assert f"the {len(closed.fixed)} fixed values" in fixed
        else:
            named = set(re.findall(r"`([a-z0-9_]+)`", fixed))
            assert set(closed.fixed) <= named, (name, set(closed.fixed) - named)
