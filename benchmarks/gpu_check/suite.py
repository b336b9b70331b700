"""The GPU test suite, run and counted: every test file that exercises CUDA (tests/test_gpu*.py, the
alignment tests, and any test file that asks ``torch.cuda.is_available()``, so new GPU tests join
without an edit here), or the whole suite with ``--tests all``."""
from __future__ import annotations

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


def run_suite(selection: str, timeout: float, workers: int = 0) -> SuiteResult:
    files = gpu_test_files() if selection == "gpu" else ["tests"]
    cmd = [sys.executable, "-m", "pytest", "-q", "-rfEs", "-p", "no:cacheprovider", *files]
    if workers > 1:
        cmd += ["-n", str(workers)]
    t = time.perf_counter()
    try:
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
        out, code = proc.stdout + proc.stderr, proc.returncode
    except subprocess.TimeoutExpired as exc:
        text = exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        out, code = text + f"\ncut off after {timeout:.0f} s", -1
    problems = [ln for ln in out.splitlines() if ln.startswith(("FAILED", "ERROR", "SKIPPED"))]
    return SuiteResult(selection, files, code, time.perf_counter() - t, counts_of(out), problems)
