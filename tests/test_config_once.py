"""`hpcbench train` resolves the workload config (preset/TOML, the data root, --set, validation) once per
process and trains with that object; staged inside the job, the workload reads this node's staged folder."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.conftest import ROOT, packed_tiny_dataset, project_env

TOY = ["train", "tests.harness_toy:ToyWorkload", "--config", "tests/harness_configs/mini.toml", "--no-progress"]

# one process: count the calls of the resolver (both names it is reachable by) and record the config each
# workload was built with, then run the CLI
COUNTING = """
import json, sys
import hpcbench.common.config as config
import hpcbench.common.workload as workload
from tests.harness_toy import ToyWorkload

calls, roots = [], []
real = config.load_config

def counted(*a, **k):
    calls.append(a[0].__name__)
    return real(*a, **k)

config.load_config = workload.load_config = counted
init = ToyWorkload.__init__

def recording(self, cfg, *a, **k):
    roots.append([str(cfg.data.root), cfg.data.node_local])
    init(self, cfg, *a, **k)

ToyWorkload.__init__ = recording
from hpcbench.cli import main
rc = main(sys.argv[1:])
print("COUNT " + json.dumps({"rc": rc, "calls": calls, "roots": roots}), flush=True)
"""


def _counted(args: list[str]) -> dict:
    proc = subprocess.run([sys.executable, "-c", COUNTING, *args], cwd=ROOT, env=project_env(), capture_output=True,
                          text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (line,) = [ln for ln in proc.stdout.splitlines() if ln.startswith("COUNT ")]
    return json.loads(line[len("COUNT "):])


def test_dump_config_resolves_once() -> None:
    got = _counted([*TOY, "--dump-config"])
    assert got == {"rc": 0, "calls": ["ToyConfig"], "roots": []}


def test_a_training_run_resolves_once_and_builds_the_workload_from_that_config(tmp_path: Path) -> None:
    got = _counted([*TOY, "--results", str(tmp_path / "sub"), "--data", str(tmp_path / "d")])
    assert got == {"rc": 0, "calls": ["ToyConfig"], "roots": [[str(tmp_path / "d"), False]]}


def test_staged_in_the_job_the_workload_reads_this_nodes_folder_resolved_once(tmp_path: Path) -> None:
    packed = packed_tiny_dataset(tmp_path)
    got = _counted([*TOY, "--results", str(tmp_path / "sub"), "--stage-from", str(packed),
                    "--stage-to", str(tmp_path / "local" / "node{node}")])
    assert got == {"rc": 0, "calls": ["ToyConfig"], "roots": [[str(tmp_path / "local" / "node0"), True]]}
    assert (tmp_path / "local" / "node0" / "train").is_dir()
