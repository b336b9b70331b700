"""The official tools run from one host that imported them once (hpcbench.report.toolhost) say what they say
as one ``python -m`` each: the same exit status and output for a tool that succeeds, exits with a status or a
message, or crashes; a tool that hangs is stopped at the limit with the others' results kept, and nothing of
it is left running; the real tools give the same verdicts both ways."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hpcbench.report import official
from hpcbench.report.official import available, start_tools

STUB = '''
import os, sys, time
mode = sys.argv[1]
print("argv", sys.argv[1:], "cwd", os.getcwd())
print("to stderr", file=sys.stderr)
if mode == "ok":
    pass
elif mode == "status":
    sys.exit(3)
elif mode == "message":
    sys.exit("a message to the user")
elif mode == "crash":
    raise ValueError("the tool's own error")
elif mode == "hang":
    with open(sys.argv[2] + ".part", "w") as f:
        f.write(str(os.getpid()))
    os.replace(sys.argv[2] + ".part", sys.argv[2])  # whole when it appears
    time.sleep(120)
'''


@pytest.fixture
def stub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    pkg = tmp_path / "mods" / "stubtool"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "__main__.py").write_text(STUB)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path / "mods"), os.environ.get("PYTHONPATH", "")]))
    work = tmp_path / "work"
    work.mkdir()
    return work


def _gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state in ("Z", "X")  # an orphan that nobody has reaped yet is not running


@pytest.mark.skipif(not hasattr(os, "fork"), reason="the host forks")
def test_each_tool_says_the_same_from_the_host_as_from_its_own_python(stub: Path) -> None:
    jobs = {m: ["stubtool", m] for m in ("ok", "status", "message", "crash")}
    both = [start_tools(jobs, stub, host=h).wait() for h in (True, False)]
    for got in both:
        assert {k: rc for k, (_, rc, _) in got.items()} == {"ok": 0, "status": 3, "message": 1, "crash": 1}
        assert all(cmd == [sys.executable, "-m", "stubtool", k] for k, (cmd, _, _) in got.items())
        assert all(f"argv ['{k}'] cwd {stub}" in out and "to stderr" in out for k, (_, _, out) in got.items())
        assert "a message to the user" in got["message"][2]
        assert "Traceback" in got["crash"][2] and "ValueError: the tool's own error" in got["crash"][2]
    host, alone = both  # line for line, but for the traceback's frames (the host's runpy call is one more)
    assert {k: sorted(ln for ln in v[2].splitlines() if not ln.startswith("  ")) for k, v in host.items()} == \
        {k: sorted(ln for ln in v[2].splitlines() if not ln.startswith("  ")) for k, v in alone.items()}


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_hanging_tool_is_stopped_at_the_limit_and_the_others_keep_their_results(
        stub: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(official, "TOOL_TIMEOUT_S", 3)
    pid_file = stub / "hang.pid"
    t = time.monotonic()
    got = start_tools({"ok": ["stubtool", "ok"], "hang": ["stubtool", "hang", str(pid_file)]}, stub).wait()
    assert time.monotonic() - t < 30
    assert got["hang"][1] is None and got["hang"][2].rstrip().endswith("(stopped after 3 s)"), got["hang"]
    assert got["ok"][1] == 0 and "argv ['ok']" in got["ok"][2]  # it had finished before the host was stopped
    pid = int(pid_file.read_text())
    deadline = time.monotonic() + 10
    while not _gone(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _gone(pid), f"the hanging tool (pid {pid}) still runs"


@pytest.mark.skipif(not available() or not hasattr(os, "fork"), reason="needs mlperf-logging and fork")
def test_the_real_tools_give_the_same_verdicts_from_the_host(tmp_path: Path) -> None:
    from mllog_synth import SynthRun, write_benchmark

    root = tmp_path / "sub"
    write_benchmark(root, "strong", [SynthRun(i * 1000.0, 300.0 + 7.0 * i, seed=i + 1) for i in range(5)],
                    system="box")
    sysfile = next((root / "systems").glob("*.json"))
    jobs = {"summarizer": ["mlperf_logging.result_summarizer", str(root), "hpc", "3.0.0"],
            "package": ["mlperf_logging.package_checker", str(root), "hpc", "3.0.0", "--log_output",
                        str(tmp_path / "pc.log")],
            "system": ["mlperf_logging.system_desc_checker", str(sysfile), "hpc", "3.0.0", "--log_output",
                       str(tmp_path / "sd.log")]}
    host, alone = (start_tools(jobs, tmp_path, host=h).wait() for h in (True, False))
    assert {k: v[1] for k, v in host.items()} == {k: v[1] for k, v in alone.items()}
    assert host["package"][2] == alone["package"][2] and "Running compliance checks in dir" in host["package"][2]
    assert official.SYSTEM_OK in host["system"][2] and host["system"][2] == alone["system"][2]
    assert [ln for ln in host["summarizer"][2].splitlines() if "," in ln] == \
        [ln for ln in alone["summarizer"][2].splitlines() if "," in ln]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize("host", [True, False])
def test_a_report_that_stops_early_leaves_no_tool_running(stub: Path, host: bool) -> None:
    """The host runs in a session of its own (so that its time limit can end it and every tool it forked at
    once); a report stopped early (Ctrl-C reaches only the report) ends them on leaving the block."""
    pid_file = stub / "hang.pid"
    with pytest.raises(KeyboardInterrupt):
        with start_tools({"hang": ["stubtool", "hang", str(pid_file)]}, stub, host=host):
            deadline = time.monotonic() + 30
            while not pid_file.exists() and time.monotonic() < deadline:
                time.sleep(0.05)
            raise KeyboardInterrupt
    pid = int(pid_file.read_text())
    deadline = time.monotonic() + 10
    while not _gone(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _gone(pid), f"the tool (pid {pid}) still runs after the report stopped"


@pytest.mark.skipif(not hasattr(os, "fork"), reason="the host forks")
def test_a_tool_that_cannot_start_says_why(stub: Path) -> None:
    """A job that fails before its tool runs (its output file cannot be made) ends with status 1 and the
    reason, the host's traceback naming the path, in the host's own output (which the report shows)."""
    missing = stub / "no-such-folder" / "tool.out"
    spec = stub / "spec.json"
    spec.write_text(json.dumps({"status": str(stub / "status.json"), "jobs": [
        {"name": "x", "module": "stubtool", "args": ["ok"], "cwd": str(stub), "output": str(missing)}]}))
    proc = subprocess.run([sys.executable, "-m", "hpcbench.report.toolhost", str(spec)], cwd=stub,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and json.loads((stub / "status.json").read_text()) == {"x": 1}
    said = proc.stdout + proc.stderr
    assert "FileNotFoundError" in said and str(missing) in said, said
