"""The GPU test suite, run and counted: every test file that exercises CUDA (tests/test_gpu*.py, the
alignment tests, and any test file that asks ``torch.cuda.is_available()``, so new GPU tests join
without an edit here), or the whole suite with ``--tests all``."""
from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
COUNTED = ("passed", "failed", "skipped", "error", "errors", "xfailed", "xpassed")


@dataclass
class SuiteResult:
    selection: str
    files: list[str]
    exit_code: int
    seconds: float
    counts: dict[str, int] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)  # FAILED / ERROR / SKIPPED lines


def gpu_test_files(root: Path = ROOT) -> list[str]:
    tests = root / "tests"
    picked = {p for p in tests.glob("test_gpu*.py")} | {tests / "test_harness_align.py"}
    picked |= {p for p in tests.glob("test_*.py") if "torch.cuda.is_available()" in p.read_text(errors="replace")}
    return sorted(str(p.relative_to(root)) for p in picked if p.exists())


def counts_of(output: str) -> dict[str, int]:
    """The counts of pytest's final summary line ("3 passed, 1 skipped in 2.0s")."""
    lines = [ln for ln in output.splitlines() if re.search(r"\d+ (passed|failed|skipped|errors?)\b", ln)]
    if not lines:
        return {}
    found = dict((word, int(n)) for n, word in re.findall(r"(\d+) ([a-z]+)", lines[-1]) if word in COUNTED)
    if "errors" in found:
        found["error"] = found.pop("errors") + found.get("error", 0)
    return found


def progress_counts(output: str) -> dict[str, int]:
    """What a cut-off run had done: pytest -q's progress characters ("..F.s [ 40%]") counted, since there is
    no summary line to read."""
    marks = {".": "passed", "F": "failed", "E": "error", "s": "skipped", "x": "xfailed", "X": "xpassed"}
    found: dict[str, int] = {}
    for ln in output.splitlines():
        m = re.fullmatch(r"([.FEsxX]+)\s*(\[\s*\d+%\])?", ln.strip())
        if m:
            for ch in m.group(1):
                found[marks[ch]] = found.get(marks[ch], 0) + 1
    return found


def suite_env(workers: int, cores: int | None = None) -> dict[str, str]:
    """The environment of the test run: with ``workers`` processes, each gets its share of the cores as
    torch / OpenMP threads (on a 16-core H200 machine, 8 workers of 16 threads each beside the datasets
    being written ran the load to 104 and the GPU tests past 135 s without a summary line)."""
    cores = cores or os.cpu_count() or 1
    env = dict(os.environ)
    if workers > 1:
        share = str(max(1, cores // workers))
        for key in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
            env[key] = share
    return env


def run_suite(selection: str, timeout: float, workers: int = 0) -> SuiteResult:
    files = gpu_test_files() if selection == "gpu" else ["tests"]
    cmd = [sys.executable, "-m", "pytest", "-q", "-rfEs", "-p", "no:cacheprovider", *files]
    if workers > 1:
        cmd += ["-n", str(workers)]
    if importlib.util.find_spec("pytest_timeout") is not None:
        # a test that hangs (a collective waiting on a rank, a driver call) fails alone, with its stack,
        # instead of holding the whole run to its cut-off with nothing counted
        cmd += ["--timeout", str(max(30, int(timeout / 3)))]
    t = time.perf_counter()
    try:
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                              env=suite_env(workers))
        out, code = proc.stdout + proc.stderr, proc.returncode
    except subprocess.TimeoutExpired as exc:
        def text(b: bytes | str | None) -> str:
            return b.decode(errors="replace") if isinstance(b, bytes) else (b or "")

        out, code = text(exc.stdout) + "\n" + text(exc.stderr) + f"\ncut off after {timeout:.0f} s", -1
    problems = [ln for ln in out.splitlines() if ln.startswith(("FAILED", "ERROR", "SKIPPED"))]
    counts = counts_of(out)
    if not counts:  # cut off or crashed: what it had done, and its last lines, so the cause can be read
        counts = {f"{k} before the cut-off": v for k, v in progress_counts(out).items()}
        problems += [f"| {ln}" for ln in out.strip().splitlines()[-25:]]
    return SuiteResult(selection, files, code, time.perf_counter() - t, counts, problems)
