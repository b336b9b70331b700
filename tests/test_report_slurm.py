"""Real Slurm integration: a private slurmctld/slurmd/munged on loopback runs a rendered weak-scaling
job (2 instances x 2 ranks of the harness's toy workload, one srun, pmi2 + the MPICH wheel) that trains,
then reports; the test checks the logs, the official checker's verdict and the report's numbers."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from conftest import ROOT, packed_tiny_dataset, project_env
from hpcbench.jobs import JobSpec, render
from slurm_local import LocalSlurm, available

pytestmark = pytest.mark.timeout(420)


@pytest.fixture(scope="module")
def slurm(tmp_path_factory: pytest.TempPathFactory):  # noqa: ANN201
    reason = available()
    if reason:
        pytest.skip(reason)
    s = LocalSlurm(tmp_path_factory.mktemp("slurm"))
    s.env.update(project_env(PATH=f"{Path(sys.executable).parent}:{project_env().get('PATH', '')}"))
    try:
        s.start()
        yield s
    finally:
        s.stop()


def test_rendered_weak_job_stages_trains_and_reports(slurm: LocalSlurm, tmp_path: Path) -> None:
    """The toy workload trains (cosmoflow mini needs minutes per instance on 2 cores); staging of a
    packed dataset to each emulated node's folder is real and runs inside the job."""
    results = tmp_path / "sub"
    script = render(JobSpec(system="local", workload="tests.harness_toy:ToyWorkload", mode="weak", instances=2,
                            nodes_per_instance=2, config="tests/harness_configs/mini.toml", results=str(results),
                            stage_from=str(packed_tiny_dataset(tmp_path)), stage_to=str(tmp_path / "local" / "node{node}"),
                            time="00:10:00"))
    job = tmp_path / "job.sh"
    job.write_text(script)
    out = tmp_path / "job.out"
    sub = slurm.run(["sbatch", "--parsable", f"--output={out}", str(job)], timeout=30, cwd=ROOT)
    assert sub.returncode == 0, sub.stderr
    job_id = sub.stdout.strip().split(";")[0]
    state = slurm.wait_job(job_id, timeout=360)
    text = out.read_text() if out.exists() else "(no job output)"
    assert state == "COMPLETED", f"job {job_id}: {state}\n{text}\n{slurm.logs()}"
    folder = results / "results" / "local" / "weak" / "cosmoflow"
    assert sorted(p.name for p in folder.glob("result_*.txt")) == ["result_0.txt", "result_1.txt"]
    assert text.count(": success after") == 2, text
    data = json.loads((results / "report" / "report.json").read_text())
    (g,) = data["groups"]
    s, off = g["score"], g["official"]
    assert (s["M"], s["M_prime"], s["S"], s["T"]) == (2, 2, 2, 4)
    assert off["compliance"] == {"result_0.txt": True, "result_1.txt": True}
    # 2 < 10 converged cosmoflow models: the official summarizer scores nothing, and the report says so
    assert off["produced"] is False and "Not enough converging" in off["why_none"]
    assert all(c["agree"] is not False for c in g["checks"]), g["checks"]
    assert (results / "report" / "local_weak_cosmoflow_timeline.png").exists()
    assert all(r["staging_s"] is not None for r in s["runs"])
    for first in (0, 2):  # each instance's 2 nodes together hold the whole training split
        files = {f.name for n in (first, first + 1) for f in (tmp_path / "local" / f"node{n}").glob("train/*")}
        assert files == {f"s{i}.tfrecord" for i in range(4)}, (first, files)
