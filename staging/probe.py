"""A small probe of this machine's staging rates, the defaults of ``hpcbench stage --dry-run``'s model.

Measured in about a second and cached (``~/.cache/hpcbench/stage_probe.json``, keyed by CPU model
and core count; ``--probe`` measures again). What it measures stands in for a node of the cluster
being modelled; every rate can be overridden on the command line, and the dry run says which
values came from where:

- decompress: zstd (level 3) output bytes/s of CosmoFlow-like int16 counts, one thread, times the
  staging threads (capped at the cores);
- write: buffered writes + fsync of a file in a temporary folder (node-local disk here);
- fabric: a memory copy (what an Allgatherv between ranks of one host does) halved (in and out);
- fs: reading back a file evicted from the page cache (the local disk: a stand-in only; pass
  ``--fs-GBps`` for a real shared filesystem).
"""
from __future__ import annotations

import json
import os
import platform
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import zstandard

PROBE_VERSION = 1
SIZE = 64 << 20


def _cpu() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _best(fn: Any, reps: int = 3) -> float:
    return min(fn() for _ in range(reps))


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
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                t0 = time.perf_counter()
                while os.read(fd, 8 << 20):
                    pass
                return time.perf_counter() - t0
            finally:
                os.close(fd)

        w = _best(wr)
        r = _best(rd)
    n = len(raw) / 1e9
    return {"decompress_GBps_thread": n / _best(dec), "write_GBps": n / w, "fabric_GBps": n / _best(cp) / 2,
            "fs_GBps": n / r, "compression": len(frame) / len(raw)}


def cache_path() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "hpcbench" / "stage_probe.json"


def probe(refresh: bool = False, folder: Path | None = None) -> dict[str, Any]:
    """The cached probe of this machine, measured (and cached) when missing, stale or ``refresh``."""
    key = {"version": PROBE_VERSION, "cpu": _cpu(), "cores": os.cpu_count() or 1}
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
