"""One import name: the wheel installs only ``hpcbench``; the product's import graph has no circle; a folder
named like a workload in the working directory changes nothing."""
from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from hpcbench import _folders

from tests.conftest import ROOT, run_cli


def _modules() -> dict[str, Path]:
    """Every module of the installed product: its import name -> file."""
    out: dict[str, Path] = {}
    tops = {"hpcbench": "hpcbench", **_folders.mapped(ROOT)}
    for name, folder in tops.items():
        base = ROOT / folder
        for f in base.rglob("*.py"):
            rel = f.relative_to(base).with_suffix("")
            parts = [p for p in rel.parts if p != "__init__"]
            out[".".join([name, *parts])] = f
    return out


def _benchmark_modules() -> dict[str, Path]:
    """The benchmark scripts (run as ``python -m benchmarks.NAME``): ``benchmarks.<stem>`` -> file."""
    bench = ROOT / "benchmarks"
    return {"benchmarks": bench / "__init__.py",
            **{f"benchmarks.{f.stem}": f for f in sorted(bench.glob("*.py")) if f.name != "__init__.py"}}


def _imports(name: str, path: Path, known: set[str]) -> set[str]:
    """Product modules ``name`` imports at module level or in functions (TYPE_CHECKING blocks excluded)."""
    tree = ast.parse(path.read_text(), str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()

    def skip(node: ast.AST) -> bool:
        return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)

    def visit(node: ast.AST) -> None:
        if skip(node):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            targets = [f"{base}.{a.name}" for a in node.names] + [base]
        else:
            targets = []
        for t in targets:
            while t and t not in known:
                t = t.rpartition(".")[0]
            if t and t != name:
                found.add(t)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    # importing a package's submodule imports the package itself: edges to ancestors are not circles
    return {t for t in found if not name.startswith(t + ".")}


def test_the_product_has_no_import_circle() -> None:
    mods = {**_modules(), **_benchmark_modules()}  # the benchmarks too: they import the product and each other
    graph = {n: _imports(n, p, set(mods)) for n, p in mods.items()}
    # Tarjan's strongly connected components
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    circles: list[list[str]] = []
    sys.setrecursionlimit(10000)

    def strong(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                circles.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            strong(v)
    assert not circles, "import circles: " + "; ".join(" <-> ".join(c) for c in circles)


def test_every_top_level_folder_maps_under_hpcbench() -> None:
    mapped = _folders.mapped(ROOT)
    assert mapped["hpcbench.common"] == "common" and mapped["hpcbench.staging"] == "staging"
    for folder in ("cosmoflow", "deepcam", "opencatalyst", "mlperf_training"):
        assert mapped[f"hpcbench.workloads.{folder}"] == folder
    assert all(name.startswith("hpcbench.") for name in mapped)


def test_no_sys_path_edits_in_benchmarks_or_tests() -> None:
    offenders = [str(p.relative_to(ROOT)) for d in ("benchmarks", "tests") for p in (ROOT / d).rglob("*.py")
                 if "sys.path.insert" in p.read_text() or "sys.path.append" in p.read_text()]
    assert offenders == [p for p in offenders if p.endswith("test_packaging.py")]


def test_a_folder_named_like_a_workload_in_the_working_directory_changes_nothing(tmp_path: Path) -> None:
    for name in ("cosmoflow", "deepcam", "common", "staging"):
        (tmp_path / name).mkdir()
    proc = run_cli(["train", "cosmoflow", "--dump-config"], cwd=tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "[optim]" in proc.stdout


@pytest.mark.slow
def test_the_wheel_installs_one_top_level_name(tmp_path: Path) -> None:
    pytest.importorskip("setuptools")
    # a copy of the sources: setuptools builds in the source tree (build/, *.egg-info)
    src = tmp_path / "src"
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(".git", ".venv", "build", "dist", "*.egg-info",
                                                             "__pycache__", ".pytest_cache", "results", "runs"))
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                           "-w", str(tmp_path), str(src)], capture_output=True, text=True, timeout=300)
    if proc.returncode != 0 and "No module named" in proc.stderr:
        pytest.skip(f"cannot build a wheel here: {proc.stderr[-300:]}")
    assert proc.returncode == 0, proc.stderr
    wheel = next(tmp_path.glob("hpcbench-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert tops == {"hpcbench"}
    for expected in ("hpcbench/common/trainer.py", "hpcbench/staging/stage.py",
                     "hpcbench/workloads/cosmoflow/workload.py", "hpcbench/workloads/cosmoflow/configs/mini.toml",
                     "hpcbench/workloads/mlperf_training/bert/workload.py",
                     "hpcbench/workloads/openfold_mlperf/pinned/mini_pretrained_checkpoint.pt",
                     "hpcbench/workloads/opencatalyst/triplet_kernels.c",  # built at first use (common/ckernel.py)
                     "hpcbench/workloads/opencatalyst/radial_kernels.c",
                     "hpcbench/workloads/opencatalyst/edge_sum_kernels.c"):
        assert expected in names
    # the Slurm templates and system files, kept at the repository's top, travel as hpcbench/jobs/...
    jobs = sorted(f"hpcbench/{p.relative_to(ROOT)}" for pattern in ("jobs/templates/*.in", "jobs/systems/*.toml")
                  for p in ROOT.glob(pattern))
    assert "hpcbench/jobs/templates/weak.sbatch.in" in jobs and "hpcbench/jobs/systems/local.toml" in jobs
    assert sorted(n for n in names if n.startswith("hpcbench/jobs/")) == jobs
    # and the installed package reads them there: render a job from the unpacked wheel, outside any checkout
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"PYTHONPATH": str(site)}
    where = subprocess.run([sys.executable, "-c", "import hpcbench.jobs as j; print(j.__file__, j.JOBS_DIR)"],
                           cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert where.returncode == 0, where.stderr
    assert where.stdout.split() == [str(site / "hpcbench" / "jobs.py"), str(site / "hpcbench" / "jobs")]
    proc = subprocess.run([sys.executable, "-m", "hpcbench", "jobs", "render", "--system", "local", "--workload",
                           "cosmoflow"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("#!") and "hpcbench train cosmoflow" in proc.stdout
