"""A small probe of this machine's staging rates, the defaults of ``hpcbench stage --dry-run``'s model.

Measured in a few seconds and cached (``~/.cache/hpcbench/stage_probe.json``, keyed by CPU model
and core count; ``--probe`` measures again). What it measures stands in for a node of the cluster
being modelled; every rate can be overridden on the command line, and the dry run says which
values came from where:

- decompress: zstd (level 3) output bytes/s of CosmoFlow-like int16 counts, one thread, times the
  staging threads (capped at the cores);
- stage_path: the real node-local path of ``--method packed`` on one thread (staging.nodelocal's
  FileAssembly: decompress, size and crc32c checks, write, the batched fsync, rename) and of
  ``--method copy`` (``copy_path``: read from the page cache, atomic write with fsync), output bytes/s;
- cores_effective: the same packed path on ``cores`` threads at once, its aggregate rate over one
  thread's: the cores staging really gets on this host now (other jobs' load counts);
- write: buffered writes + fsync of a file in a temporary folder (node-local disk here);
- fabric: a memory copy (what an Allgatherv between ranks of one host does) halved (in and out);
- fs: reading back a file evicted from the page cache (the local disk: a stand-in only; pass
  ``--fs-GBps`` for a real shared filesystem).
"""
from __future__ import annotations

import json
import math
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import zstandard

from hpcbench.common.pagecache import evict
from hpcbench.common.system import cpu_model

PROBE_VERSION = 2
SIZE = 64 << 20
PATH_FILES, PATH_FILE = 4, 8 << 20  # the stage-path probe: 4 files of 8 MiB each


def _best(fn: Any, reps: int = 3) -> float:
    return min(fn() for _ in range(reps))


def _path_rates(raw: bytes, folder: Path) -> dict[str, float]:
    """The real node-local write paths (packed and copy), one thread and ``cores`` threads at once."""
    import shutil
    from concurrent.futures import ThreadPoolExecutor

    import crc32c

    from hpcbench.common.atomic import atomic_write

    from .manifest import FileEntry, Frame
    from .nodelocal import FileAssembly, sync_all

    cctx = zstandard.ZstdCompressor(level=3)
    blob, entries = bytearray(), []
    for i in range(PATH_FILES):
        part = raw[i * PATH_FILE:(i + 1) * PATH_FILE]
        z = cctx.compress(part)
        c = crc32c.crc32c(part)
        entries.append(FileEntry(f"f{i}", len(part), c, [Frame(len(blob), len(z), 0, len(part), c)]))
        blob += z
    view = memoryview(bytes(blob))
    srcdir = folder / "src"
    srcdir.mkdir()
    for i, e in enumerate(entries):
        (srcdir / e.name).write_bytes(raw[i * PATH_FILE:(i + 1) * PATH_FILE])
    total = PATH_FILES * PATH_FILE

    def packed(out: Path) -> float:
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir()
        t0 = time.perf_counter()
        asms = [FileAssembly(out / e.name, e, 0) for e in entries]
        for a, e in zip(asms, entries):
            a.write_frame(view, e.frames[0], "probe")
        sync_all(asms)
        for a in asms:
            a.commit()
        return time.perf_counter() - t0

    def copy(out: Path) -> float:
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir()
        t0 = time.perf_counter()
        for e in entries:
            with open(srcdir / e.name, "rb") as src, atomic_write(out / e.name) as dst:
                shutil.copyfileobj(src, dst, 8 << 20)
        return time.perf_counter() - t0

    one = _best(lambda: packed(folder / "p0"))
    cp = _best(lambda: copy(folder / "c0"))
    cores = os.cpu_count() or 1
    with ThreadPoolExecutor(cores) as pool:
        def together() -> float:
            t0 = time.perf_counter()
            list(pool.map(packed, [folder / f"p{i}" for i in range(cores)]))
            return time.perf_counter() - t0
        par = _best(together)
    return {"stage_path_GBps_thread": total / one / 1e9, "copy_path_GBps_thread": total / cp / 1e9,
            "cores_effective": min(float(cores), max(0.1, cores * one / par))}


def measure(folder: Path | None = None) -> dict[str, float]:
    """One thread's rates on this machine (GB/s); ``folder``: where the write/read probe file goes."""
    rng = np.random.default_rng(0)
    raw = rng.poisson(1.0, SIZE // 2).astype(np.int16).tobytes()
    frame = zstandard.ZstdCompressor(level=3).compress(raw)
    dctx = zstandard.ZstdDecompressor()

    def dec() -> float:
        t0 = time.perf_counter()
        dctx.decompress(frame, max_output_size=len(raw))
        return time.perf_counter() - t0

    src = np.frombuffer(raw, dtype=np.uint8)
    dst = np.empty_like(src)

    def cp() -> float:
        t0 = time.perf_counter()
        np.copyto(dst, src)
        return time.perf_counter() - t0

    with tempfile.TemporaryDirectory(dir=folder) as tmp:
        path = Path(tmp) / "probe.bin"

        def wr() -> float:
            t0 = time.perf_counter()
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            try:
                os.write(fd, raw)
                os.fsync(fd)
            finally:
                os.close(fd)
            return time.perf_counter() - t0

        def rd() -> float:
            fd = os.open(path, os.O_RDONLY)
            try:
                evict(fd)
                t0 = time.perf_counter()
                while os.read(fd, 8 << 20):
                    pass
                return time.perf_counter() - t0
            finally:
                os.close(fd)

        w = _best(wr)
        r = _best(rd)
        paths = _path_rates(raw, Path(tmp))
    n = len(raw) / 1e9
    return {"decompress_GBps_thread": n / _best(dec), "write_GBps": n / w, "fabric_GBps": n / _best(cp) / 2,
            "fs_GBps": n / r, "compression": len(frame) / len(raw)} | paths


def cache_path() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "hpcbench" / "stage_probe.json"


def probe(refresh: bool = False, folder: Path | None = None) -> dict[str, Any]:
    """The cached probe of this machine, measured (and cached) when missing, stale or ``refresh``."""
    key = {"version": PROBE_VERSION, "cpu": cpu_model(), "cores": os.cpu_count() or 1}
    path = cache_path()
    if not refresh:
        try:
            got = json.loads(path.read_text())
            if all(got.get(k) == v for k, v in key.items()):
                return got | {"cached": True}
        except (OSError, ValueError):
            pass
    out = key | measure(folder) | {"measured_at": time.strftime("%Y-%m-%d %H:%M:%S")}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(out, indent=1))
        os.replace(tmp, path)
    except OSError:
        pass  # a read-only home: measure each time
    return out | {"cached": False}


def node_rates(pr: dict[str, Any], threads: int, cores_per_node: float) -> dict[str, float]:
    """A node's local rates (GB/s) from the probe's real-path rates: writes at copy's path rate, and
    decompression at the rate of what the packed path costs beyond that write (so the two add up to the
    packed path), each thread rate times min(threads, cores_per_node); the fabric on one thread."""
    from .model import node_rate

    write = node_rate(pr["copy_path_GBps_thread"], threads, cores_per_node)
    stage = node_rate(pr["stage_path_GBps_thread"], threads, cores_per_node)
    extra = 1 / stage - 1 / write  # seconds per GB beyond a plain write
    return {"write_GBps": write, "decompress_GBps": 1 / extra if extra > 0 else math.inf,
            "fabric_GBps": node_rate(pr["fabric_GBps"], 1, cores_per_node)}
