"""Dedicated evaluation ranks (``train.eval_ranks``, common/async_eval.py) under real mpiexec: the metric
of every evaluation equals the inline evaluation of the same weights, the run stops at the first result
that meets the target, the log passes the official checker, and bad settings and failing or hung
evaluation ranks end in errors that name the key or the rank."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from hpcbench.common.parallel import Degrees, check_degrees
from hpcbench.common.dist import init_distributed
from hpcbench.common.errors import ConfigError
from hpcbench.common.mllog import MLPerfLogger, check_log
from hpcbench.common.system import SystemDescription
from hpcbench.common.trainer import Trainer
from hpcbench.results_layout import benchmark_dir
from tests.conftest import run_mpi
from tests.harness_toy import ToyDlrm, ToyWorkload

SCRIPT = "tests/mpi_scripts/harness_eval_ranks.py"


@pytest.fixture(scope="module")
def env():  # noqa: ANN201 - one singleton-MPI torch group for the in-process checks of this module
    e = init_distributed(device="cpu")
    yield e
    e.close()


def _rows(stdout: str) -> dict[int, dict]:
    return {r["rank"]: r for r in (json.loads(m) for m in re.findall(r'\{"rank"[^{}]*\}', stdout))}


def _lines(log: Path) -> list[dict]:
    return [json.loads(x.split(":::MLLOG ", 1)[1]) for x in log.read_text().splitlines() if ":::MLLOG" in x]


def _run(n: int, tmp: Path, cls: str, *overrides: str) -> tuple[dict[int, dict], Path]:
    log = tmp / f"{cls}_{n}.txt"
    rows = _rows(run_mpi(n, [SCRIPT, "run", cls, str(log), *overrides], timeout=180).stdout)
    assert sorted(rows) == list(range(n)), rows
    return rows, log


@pytest.fixture(scope="module")
def inline(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The reference: 2 ranks that train and evaluate (eval_ranks = 0), same seed."""
    rows, _ = _run(2, tmp_path_factory.mktemp("inline"), "ToyWorkload")
    return rows[0]


@pytest.mark.mpi
@pytest.mark.parametrize("eval_ranks", [1, 2])
def test_eval_ranks_give_the_inline_metrics_and_stop_at_the_target(inline: dict, tmp_path: Path,
                                                                   eval_ranks: int) -> None:
    n = 2 + eval_ranks
    rows, log = _run(n, tmp_path, "ToyWorkload", f"train.eval_ranks={eval_ranks}")
    lead = rows[0]
    assert inline["status"] == lead["status"] == "success"
    # the same training (2 training ranks, same shards): the same evaluations, up to the one that met the target
    assert [e for e, _ in lead["metrics"]] == [e for e, _ in inline["metrics"]]
    for (_, mine), (_, ref) in zip(lead["metrics"], inline["metrics"]):
        assert mine == pytest.approx(ref, rel=1e-6)
    assert lead["metrics"][-1][1] <= 0.1 < lead["metrics"][-2][1]
    assert rows[1]["metrics"] == lead["metrics"]  # every training rank heard every result
    # training went on while the last evaluation ran, and stopped when its result arrived
    assert lead["epochs"] >= len(inline["metrics"])
    lines = _lines(log)
    keys = [x["key"] for x in lines]
    assert keys.count("eval_start") >= keys.count("eval_stop") == len(lead["metrics"])
    owed = keys.count("eval_start") - keys.count("eval_stop")  # weights sent before the target's result came
    for r in range(2, n):  # the evaluation ranks computed the same values and ended with the run's status;
        # a job sent before the stop may have been evaluated too (its result is not logged: the run had ended)
        mine = rows[r]["metrics"]
        assert rows[r]["status"] == "success" and mine[: len(lead["metrics"])] == lead["metrics"]
        assert len(mine) - len(lead["metrics"]) <= owed
        assert all(e > lead["metrics"][-1][0] for e, _ in mine[len(lead["metrics"]):])
    stops = [x for x in lines if x["key"] == "eval_stop"]
    assert [x["metadata"]["epoch_num"] for x in stops] == [e for e, _ in lead["metrics"]]
    run_stop = next(x for x in lines if x["key"] == "run_stop")
    assert run_stop["metadata"]["status"] == "success"
    assert run_stop["time_ms"] == stops[-1]["time_ms"] == pytest.approx(lead["stop_ms"], abs=1)
    setting = next(x for x in lines if x["key"] == "hpcbench_eval_ranks")["value"]
    assert setting["value"] == eval_ranks
    ok, output = check_log(log)
    assert ok, output


@pytest.mark.mpi
def test_training_log_with_evaluations_inside_epochs_passes_the_training_checker(tmp_path: Path) -> None:
    """Without a target met the run waits for every result still owed at max epochs (aborted)."""
    rows, log = _run(3, tmp_path, "ToyDlrm", "train.eval_ranks=1", "train.eval_every=0.5", "train.target=0.99",
                     "train.max_epochs=2")
    lead = rows[0]
    assert lead["status"] == rows[2]["status"] == "aborted"
    assert [e for e, _ in lead["metrics"]] == [0.5, 1.0, 1.5, 2.0]
    lines = _lines(log)
    assert [x["metadata"]["epoch_num"] for x in lines if x["key"] == "eval_accuracy"] == [0.5, 1.0, 1.5, 2.0]
    last_eval = [x for x in lines if x["key"] == "eval_stop"][-1]
    run_stop = next(x for x in lines if x["key"] == "run_stop")
    assert run_stop["metadata"]["status"] == "aborted" and run_stop["time_ms"] >= last_eval["time_ms"]
    ok, output = check_log(log, ToyDlrm.ruleset, "training")
    assert ok, output


@pytest.mark.mpi
def test_cli_passes_eval_ranks_through(tmp_path: Path) -> None:
    proc = run_mpi(3, ["-m", "hpcbench", "train", "tests.harness_toy:ToyWorkload", "--results", str(tmp_path),
                       "--no-progress", "--device", "cpu", "--system-name", "toy", "--set", "train.eval_ranks=1"],
                   timeout=240)
    assert re.search(r"instance 0: success after \d+ epochs, eval_error=0\.0\d+", proc.stdout), proc.stdout
    log = benchmark_dir(tmp_path, "toy", "strong", "cosmoflow") / "result_0.txt"
    assert '"key": "hpcbench_eval_ranks", "value": {"value": 1' in log.read_text()
    ok, output = check_log(log)
    assert ok, output


@pytest.mark.mpi
def test_hung_evaluation_rank_times_out_naming_the_rank() -> None:
    rows = _rows(run_mpi(3, [SCRIPT, "slow"], timeout=120).stdout)
    for r in (0, 1):
        assert rows[r]["status"] == "error"
        assert "evaluation rank 2" in rows[r]["error"] and "'train.eval_timeout_s' = 1 s" in rows[r]["error"]
        assert rows[r]["seconds"] < rows[2]["seconds"]  # they did not wait for the 3 s evaluation
    assert rows[2]["status"] == "aborted"  # it finished its evaluation, then heard stop


@pytest.mark.mpi
def test_failing_evaluation_rank_stops_training_with_its_error() -> None:
    rows = _rows(run_mpi(3, [SCRIPT, "fail"], timeout=120).stdout)
    for r in (0, 1):
        assert rows[r]["status"] == "error"
        assert "evaluation rank 2 (instance 0) failed: RuntimeError: evaluation blew up" in rows[r]["error"]
    assert rows[2] == {**rows[2], "status": "raised", "error": "evaluation blew up"}


@pytest.mark.mpi
def test_training_ranks_that_fail_in_setup_release_the_evaluation_rank() -> None:
    rows = _rows(run_mpi(3, [SCRIPT, "trainfail"], timeout=120).stdout)
    for r in (0, 1):
        assert rows[r]["status"] == "error" and "no training files here" in rows[r]["error"]
    assert rows[2]["status"] == "aborted" and rows[2]["seconds"] < 30  # told to stop, not left waiting


def test_eval_ranks_that_leave_no_training_rank_are_refused(env) -> None:  # noqa: ANN001
    cfg = ToyWorkload.load_config("mini", ["train.eval_ranks=1"])
    tr = Trainer(ToyWorkload(cfg), env, MLPerfLogger(None), SystemDescription(), progress=False)
    with pytest.raises(ConfigError, match=r"'train.eval_ranks' = 1: the instance has 1 rank\(s\)"):
        tr.setup()
    with pytest.raises(ConfigError, match=r"'train.eval_ranks' = 4: the instance has 4 rank\(s\).*at most 3"):
        check_degrees(Degrees(eval_ranks=4), 4, False, 1, "cpu")
    with pytest.raises(ConfigError, match=r"'train.eval_ranks'.*node-local data.*2 nodes"):
        check_degrees(Degrees(eval_ranks=1), 4, True, 2, "cpu")
    check_degrees(Degrees(eval_ranks=1), 4, True, 1, "cpu")  # one node per instance holds the whole data
    with pytest.raises(ConfigError, match=r"'train.eval_ranks': must be >= 0"):
        ToyWorkload.load_config("mini", ["train.eval_ranks=-1"])
    with pytest.raises(ConfigError, match=r"'train.eval_timeout_s'"):
        ToyWorkload.load_config("mini", ["train.eval_timeout_s=0"])


@pytest.mark.mpi
def test_global_batch_must_split_over_the_training_ranks(tmp_path: Path) -> None:
    proc = run_mpi(3, [SCRIPT, "run", "ToyWorkload", str(tmp_path / "log.txt"), "train.eval_ranks=1",
                       "train.global_batch_size=15"], timeout=120)
    rows = _rows(proc.stdout)
    assert all("'train.global_batch_size': 15 does not split over the instance's 2 data-parallel training ranks" in r["error"]
               for r in rows.values()), rows
