"""MLPerf logging wrapper: a tiny fake run's log passes the official hpc 3.0.0 compliance checker."""
from __future__ import annotations

import json
from pathlib import Path

from hpcbench.common.mllog import MLPerfLogger, check_log, result_filename
from hpcbench.common.system import SystemDescription


def fake_run(path: Path, final_error: float, status: str = "success") -> None:
    log = MLPerfLogger(path)
    system = SystemDescription(submitter="hpcbench-tests", system_name="testbox", number_of_nodes=1)
    log.event("cache_clear", True)
    log.start("init_start")
    log.submission(system, benchmark="cosmoflow", division="closed")
    log.hyperparameters({
        "seed": 7, "global_batch_size": 4, "train_samples": 64, "eval_samples": 16,
        "opt_name": "sgd", "opt_base_learning_rate": 0.01, "opt_learning_rate_warmup_epochs": 1,
        "opt_learning_rate_warmup_factor": 1.0, "opt_learning_rate_decay_boundary_epochs": [2],
        "opt_learning_rate_decay_factor": 0.5, "opt_weight_decay": 0.0, "dropout": 0.5,
        "gradient_accumulation_frequency": 1,
    })
    log.end("init_stop")
    log.start("run_start")
    for epoch, err in enumerate([0.3, final_error], start=1):
        log.start("epoch_start", metadata={"epoch_num": epoch})
        log.end("epoch_stop", metadata={"epoch_num": epoch})
        log.start("eval_start", metadata={"epoch_num": epoch})
        log.event("eval_error", err, metadata={"epoch_num": epoch})
        log.end("eval_stop", metadata={"epoch_num": epoch})
    log.end("run_stop", metadata={"status": status})
    log.close()


def test_log_lines_are_mllog_json(tmp_path: Path) -> None:
    path = tmp_path / result_filename(0)
    fake_run(path, 0.1)
    lines = path.read_text().splitlines()
    assert all(line.startswith(":::MLLOG ") for line in lines)
    records = [json.loads(line[len(":::MLLOG "):]) for line in lines]
    keys = [r["key"] for r in records]
    assert keys[:3] == ["cache_clear", "init_start", "submission_org"]
    assert keys[-1] == "run_stop" and records[-1]["metadata"]["status"] == "success"
    assert records[-1]["event_type"] == "INTERVAL_END"


def test_official_checker_accepts_a_complete_run(tmp_path: Path) -> None:
    path = tmp_path / "result_0.txt"
    fake_run(path, 0.1)
    ok, output = check_log(path)
    assert ok, output


def test_official_checker_rejects_target_not_reached(tmp_path: Path) -> None:
    path = tmp_path / "result_0.txt"
    fake_run(path, 0.2)  # cosmoflow needs eval_error <= 0.124 at least once
    ok, output = check_log(path)
    assert not ok


def test_disabled_logger_writes_nothing(tmp_path: Path) -> None:
    log = MLPerfLogger(None)
    log.event("cache_clear", True)
    log.close()
    assert list(tmp_path.iterdir()) == []


def test_system_description_json_round_trip(tmp_path: Path) -> None:
    sd = SystemDescription(system_name="clusterA", number_of_nodes=512, accelerators_per_node=4, status="onprem")
    sd.write(tmp_path / "clusterA.json")
    raw = json.loads((tmp_path / "clusterA.json").read_text())
    assert raw["status"] == "Available on-premise" and "accelerator_on-chip_memories" in raw
    assert SystemDescription.load(tmp_path / "clusterA.json") == sd


def test_a_log_that_cannot_be_written_is_an_error_naming_it() -> None:
    """A full disk under --results: logging's FileHandler printed 'Logging error' and the run trained on without
    its log, then died in close() with a bare OSError. /dev/full answers every write with ENOSPC."""
    import pytest

    from hpcbench.common.errors import DataError

    if not Path("/dev/full").exists():
        pytest.skip("needs /dev/full (Linux)")
    log = MLPerfLogger(Path("/dev/full"))
    with pytest.raises(DataError, match=r"cannot write the MLPerf log /dev/full: No space left on device; the log is "
                                        r"incomplete \(no run_stop\)"):
        log.event("seed", 1)
    log.close()  # said once: closing does not raise it again
