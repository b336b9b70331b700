"""Shared test helpers. Multi-rank tests launch real MPI jobs with the project's own mpiexec."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# The tests share the machine: two pytest workers, each running its own tests and starting jobs of 1-4 ranks.
# A torch thread pool per process as wide as the harness makes it for a node to itself (every core, divided
# among the job's own ranks) puts 4-8 spinning OpenMP threads on a 2-core box; they wait on each other's cores
# (measured: gpu_check --smoke over every workload, its two parts at once, 143 s of CPU in 74 s alone, 86 s in
# 46 s with one thread each). So every process of the tests, this one and each it starts (they inherit the
# environment), runs one torch thread unless the caller set otherwise (a test of the harness's default thread
# count must remove HPCBENCH_TORCH_THREADS from its child's environment; none does today).
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("HPCBENCH_TORCH_THREADS", "1")


def mpiexec_path() -> str:
    """The mpiexec next to this Python (the mpich wheel's), else one on PATH."""
    local = Path(sys.executable).parent / "mpiexec"
    if local.exists():
        return str(local)
    found = shutil.which("mpiexec")
    if not found:
        pytest.fail("no mpiexec found: install the project with the 'mpich' extra (python3 dev.py setup)")
    return found


def project_env(**extra: str) -> dict[str, str]:
    """Environment for child processes: this checkout first on PYTHONPATH, unbuffered output."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env["PYTHONUNBUFFERED"] = "1"
    env.setdefault("OMP_NUM_THREADS", "1")
    env.update(extra)
    return env


# The toy workload trains to its target in ~7 epochs of a few ms each: shorter than the spread of its
# instances' start times on a loaded box (each starts when its own setup ends), so the report would flag a
# weak-scaling set whose instances do not overlap in time. Tests that report several toy instances with
# --strict train them at a lower rate so they overlap as real instances do: 39-54 epochs, 4.3-7.1 s for ten
# instances on 2 cores (at lr 0.01, 17-23 epochs of 2.0-4.4 s, a slow box once started five of ten instances
# up to 3.6 s late, after the first had stopped)
TOY_OVERLAP = ["--set", "optim.lr=0.004", "--set", "train.max_epochs=120", "--set", "optim.milestones=[100]"]


def run_mpi(n: int, args: list[str], timeout: float = 180, cwd: Path | None = None,
            env: dict[str, str] | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run ``mpiexec -n N python ARGS...``; fail the test with the output on error or timeout."""
    cmd = [mpiexec_path(), "-n", str(n), sys.executable, *args]
    try:
        proc = subprocess.run(cmd, cwd=cwd or ROOT, env=env or project_env(), capture_output=True,
                              text=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"{' '.join(cmd)} timed out after {timeout}s\n{exc.stdout}\n{exc.stderr}")
    if check and proc.returncode != 0:
        pytest.fail(f"{' '.join(cmd)} exited {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}")
    return proc


def run_cli(args: list[str], timeout: float = 300, cwd: Path | None = None,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``python -m hpcbench ARGS...`` in a child process (no check; tests look at the result)."""
    return subprocess.run([sys.executable, "-m", "hpcbench", *args], cwd=cwd or ROOT, env=env or project_env(),
                          capture_output=True, text=True, timeout=timeout)


def log_values(path: Path, key: str) -> list[object]:
    """Every value of one MLLOG key in a log, in order."""
    import json

    return [json.loads(ln.split(":::MLLOG ", 1)[1])["value"] for ln in path.read_text().splitlines()
            if f'"key": "{key}"' in ln]


def first_events(path: Path) -> dict[str, object]:
    """The first value of each MLLOG key in a log (what a test of one run's keys wants)."""
    import json

    out: dict[str, object] = {}
    for line in path.read_text().splitlines():
        if ":::MLLOG " in line:
            e = json.loads(line.split(":::MLLOG ", 1)[1])
            out.setdefault(e["key"], e["value"])
    return out


def log_records(path: Path) -> list[dict[str, object]]:
    """Every MLLOG record of a log, in order."""
    import json

    return [json.loads(ln.split(":::MLLOG ", 1)[1]) for ln in path.read_text().splitlines() if ":::MLLOG " in ln]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Files with tests marked ``slow`` first, those with the most such tests before the others (the order is
    kept otherwise, and a file's tests stay together). Under ``dev.py test`` (``--dist loadfile``) pytest-xdist
    re-sorts the files by their number of tests, so this order only breaks its ties. Handing the heaviest
    files out first (``--no-loadscope-reorder``) was measured slower on 2026-11-28 (1,981 s vs 1,658 s for the
    suite on a 2-core Xeon): the multi-process tests (``hpcbench run``, ``gpu_check --smoke``, the staging
    fault matrix) then ran at the same time on both workers and oversubscribed the two cores."""
    slow: dict[Path, int] = {}
    for item in items:
        if item.get_closest_marker("slow"):
            slow[item.path] = slow.get(item.path, 0) + 1
    items.sort(key=lambda item: -slow.get(item.path, 0))


@pytest.fixture(scope="module")
def cpu_env():  # noqa: ANN201
    """One singleton-MPI torch group (gloo, also on a GPU node) for a module's in-process training runs."""
    from hpcbench.common.dist import init_distributed

    e = init_distributed(device="cpu")
    yield e
    e.close()


def visible_files(folder: Path) -> set[str]:
    """Names in ``folder``, hidden files (journals, indexes, temporaries) left out."""
    return {p.name for p in folder.iterdir() if not p.name.startswith(".")}


def result_log(results: Path, instance: int = 0) -> Path:
    """The one ``result_<instance>.txt`` under a ``--results`` folder (official layout:
    ``results/<system>/{strong,weak}/<benchmark>/``)."""
    found = sorted(results.rglob(f"result_{instance}.txt"))
    assert len(found) == 1, f"expected one result_{instance}.txt under {results}, found {found}"
    return found[0]


def packed_tiny_dataset(tmp_path: Path) -> Path:
    """A packed CosmoFlow-layout dataset of a few small files (train: 4, validation: 2), made with
    ``hpcbench pack``; returns the packed folder ``tmp_path/packed`` (raw files in ``tmp_path/raw``)."""
    raw = tmp_path / "raw"
    for split, n in (("train", 4), ("validation", 2)):
        (raw / split).mkdir(parents=True)
        for i in range(n):
            (raw / split / f"s{i}.tfrecord").write_bytes(bytes(range(256)) * (40 + i))
    # ~10 KB shards: every split has at least 2, so instances spanning 2 nodes give each node a part
    proc = run_cli(["pack", "--dataset", "cosmoflow", "--source", str(raw), "--dest", str(tmp_path / "packed"),
                    "--shard-mb", "0.01", "--no-progress"], timeout=120)
    assert proc.returncode == 0, proc.stderr
    return tmp_path / "packed"


def one_member_pack(packed: Path, member: str, payload: bytes = b"evil") -> Path:
    """A consistent (every checksum right) packed dataset at ``packed`` whose only member is named
    ``member``: for the refusals that must come from the name itself (traversal, reserved names)."""
    import crc32c
    import zstandard

    from hpcbench.staging.manifest import MANIFEST, FileEntry, Frame, Manifest, ShardInfo, SplitInfo, encode_header

    blob = zstandard.ZstdCompressor().compress(payload)
    crc = crc32c.crc32c(payload)
    entries = [FileEntry(member, len(payload), crc, [Frame(0, len(blob), 0, len(payload), crc)])]
    hdr = encode_header("train/shard-00000.zst", entries)
    entries[0].frames[0].offset = len(hdr)  # the frame starts after the header, whose length it changes
    hdr = encode_header("train/shard-00000.zst", entries)
    (packed / "train").mkdir(parents=True)
    (packed / "train" / "shard-00000.zst").write_bytes(hdr + blob)
    shard = ShardInfo("train/shard-00000.zst", len(hdr) + len(blob), len(payload), 1, len(hdr),
                      crc32c.crc32c(hdr + blob), crc32c.crc32c(hdr))
    (packed / MANIFEST).write_text(Manifest("cosmoflow", {"train": SplitInfo(False, [shard])}, 1 << 20).to_json())
    return packed


def train_staged(tmp_path: Path, workload: str, datagen: list[str], ranks: int, instances: int,
                 sets: list[str]) -> tuple[Path, Path, Path]:
    """Synthetic ``workload`` data, packed (50 KB shards), then one ``hpcbench train`` under mpiexec with
    one rank per emulated node staging it to ``local/node{node}``; on the CPU (gloo), so a GPU node with
    fewer GPUs than ranks runs it too. Returns (raw, local, results); one epoch need not reach the
    target (exit 4)."""
    raw, packed, local, results = (tmp_path / n for n in ("raw", "packed", "local", "results"))
    proc = run_cli(["datagen", workload, "--out", str(raw), *datagen, "--workers", "1"])
    assert proc.returncode == 0, proc.stderr
    proc = run_cli(["pack", "--dataset", workload, "--source", str(raw), "--dest", str(packed),
                    "--shard-mb", "0.05", "--no-progress"])
    assert proc.returncode == 0, proc.stderr
    args = ["-m", "hpcbench", "train", workload, "--config", "mini", "--instances", str(instances), "--device", "cpu",
            "--ranks-per-node", "1", "--stage-from", str(packed), "--stage-to", str(local / "node{node}"),
            "--results", str(results), "--no-progress"]
    for kv in ["train.max_epochs=1", *sets]:
        args += ["--set", kv]
    proc = run_mpi(ranks, args, timeout=300, check=False)
    assert proc.returncode in (0, 4), proc.stdout + proc.stderr
    return raw, local, results


def damage_jpeg_entropy_data(path: Path) -> None:
    """Overwrite 8 bytes of a JPEG's entropy-coded data (no 0xFF written, the marker structure intact)
    so that libjpeg-turbo calls the data corrupt ("Corrupt JPEG data: ...", a warning Pillow and DALI
    pass on) while Pillow still decodes the file without an error. The first position, after the
    scan header, where this patch does both is used: damage after which the Huffman code
    resynchronises decodes without any warning and would prove nothing."""
    import io

    import simplejpeg
    from PIL import Image

    good = path.read_bytes()
    patch = bytes([0x5A, 0x00, 0x13, 0xC4, 0x00, 0x00, 0x7E, 0x21])
    start = good.find(b"\xff\xda") + 20
    for pos in range(start, len(good) - 16, 5):
        bad = good[:pos] + patch + good[pos + len(patch):]
        try:
            simplejpeg.decode_jpeg(bad, strict=True)
        except ValueError as exc:
            if "Corrupt JPEG data" in str(exc):
                Image.open(io.BytesIO(bad)).convert("RGB")  # Pillow: no error
                path.write_bytes(bad)
                return
    raise AssertionError(f"{path}: no position in its entropy-coded data gives libjpeg's corrupt-data warning")
