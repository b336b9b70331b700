#!/usr/bin/env python3
"""Bootstrap the project's environment and run the main job or the tests.

    python3 dev.py run [ARGS...]    # create .venv if needed, then `hpcbench run ARGS...`
    python3 dev.py test [ARGS...]   # create .venv if needed, then `pytest ARGS...` (two workers, below)
    python3 dev.py setup            # only create/refresh .venv

Needs only Python >= 3.11 and pip. The environment is rebuilt when pyproject.toml or this file
changes (a stamp in .venv records what it was built from). Set HPCBENCH_TORCH to choose the torch
requirement (default: the CPU build torch==2.13.0; a cluster sets its CUDA build here).

The tests run in two pytest-xdist workers, a test file per worker at a time (``-n 2 --dist loadfile``:
a file's module fixtures are built once), where this process may use two or more cores: the suite's
processes keep a 2-core box about 1.5 cores busy on one worker (they wait on ranks, timeouts and
launches), and about 1.9 on two. ``-n 0`` (or any ``-n``/``--dist`` of your own) overrides it.
"""
from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = Path(os.environ.get("HPCBENCH_VENV", ROOT / ".venv"))
TORCH = os.environ.get("HPCBENCH_TORCH", "torch==2.13.0")
EXTRAS = os.environ.get("HPCBENCH_EXTRAS", "mpich,dev")
STAMP = VENV / ".hpcbench-stamp"


def _bin(name: str) -> Path:
    return VENV / "bin" / name


def _fingerprint() -> str:
    h = hashlib.sha256()
    for name in ("pyproject.toml", "setup.py", "dev.py"):
        h.update((ROOT / name).read_bytes())
    h.update(f"{TORCH}|{EXTRAS}|{sys.version_info[:2]}".encode())
    return h.hexdigest()


def _pip(*args: str) -> None:
    cmd = [str(_bin("python")), "-m", "pip", "--disable-pip-version-check", "install", *args]
    print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True, cwd=ROOT)


def ensure_env() -> None:
    fingerprint = _fingerprint()
    if STAMP.exists() and STAMP.read_text().strip() == fingerprint:
        return
    if sys.version_info < (3, 11):
        sys.exit(f"dev.py: Python >= 3.11 is required, this is {sys.version.split()[0]}")
    if not _bin("python").exists():
        print(f"creating virtual environment {VENV}", flush=True)
        venv.EnvBuilder(with_pip=True).create(VENV)
    STAMP.unlink(missing_ok=True)
    # torch first and pinned: an unpinned torch drags in several GB of CUDA wheels.
    _pip("-q", TORCH)
    _pip("-q", "-e", f".[{EXTRAS}]" if EXTRAS else ".")
    STAMP.write_text(fingerprint + "\n")


def test_workers(args: list[str]) -> list[str]:
    """pytest-xdist options for ``dev.py test ARGS``: two workers by file, unless ARGS choose their own, this
    process has fewer than two cores, or the environment has no pytest-xdist (HPCBENCH_EXTRAS without dev)."""
    own = any(a in ("-n", "--numprocesses", "--dist") or a.startswith(("-n", "--numprocesses=", "--dist="))
              for a in args) or "no:xdist" in args
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    have = any(VENV.glob("lib/python3*/site-packages/xdist/__init__.py"))
    return [] if own or cores < 2 or not have else ["-n", "2", "--dist", "loadfile"]


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in ("run", "test", "setup"):
        print(__doc__)
        return 2
    ensure_env()
    env = dict(os.environ)
    env["PATH"] = f"{VENV / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    env.setdefault("PYTHONUNBUFFERED", "1")
    if argv[0] == "setup":
        return 0
    if argv[0] == "run":
        cmd = [str(_bin("hpcbench")), "run", *argv[1:]]
    else:
        cmd = [str(_bin("python")), "-m", "pytest", *test_workers(argv[1:]), *argv[1:]]
    print("+", " ".join(cmd), flush=True)
    return subprocess.run(cmd, cwd=ROOT, env=env).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
