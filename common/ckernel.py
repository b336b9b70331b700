"""Small C kernels shipped as source, built once per machine type with the system C compiler, loaded
with ctypes: the home of "compile, cache, load, or say why not".

A kernel is optional by design: :func:`load` returns ``None`` with a reason (no compiler, the build
failed, ``HPCBENCH_C_KERNELS=0``) and the caller runs its torch path instead; the reason is logged
once per kernel. The library is built with ``-march=native``, so the cache key holds the source's
hash, the compiler's version and this CPU's model and flags: a home directory shared by nodes of
different CPUs gets one library per CPU type, never one that faults on another node. A build writes
to a temporary name, loads it to check the symbols, then renames it into place (two ranks building
at once both succeed; the second rename replaces an identical file).

Cache folder: ``HPCBENCH_KERNEL_CACHE``, else ``$XDG_CACHE_HOME/hpcbench/kernels``, else
``~/.cache/hpcbench/kernels``; an unwritable folder falls back to ``$TMPDIR/hpcbench-kernels-UID``, used
only if it is this user's own directory that no one else can write (library names are predictable:
a folder another user could write would let them plant code); otherwise no kernel is built. ``CC``
may carry arguments (``ccache gcc``).
"""
from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import platform
import shlex
import shutil
import stat
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from .atomic import file_mode

log = logging.getLogger(__name__)

#: a compiler that takes longer is given up on (the torch path runs)
BUILD_TIMEOUT_S = 120
#: IEEE results except that sums may be reassociated (vectorised reductions) and a * b + c may be one fused
#: multiply-add (GCC's default outside ISO mode; -std=c11 alone turns it off: the shipped loops ran 6-20% slower
#: without it, benchmarks/results/oc20_model_step_2026-12-02_xeon-2core_c-kernels.txt); NaN and Inf propagate
CFLAGS = ("-O3", "-march=native", "-fPIC", "-shared", "-fno-math-errno", "-fno-trapping-math",
          "-fno-signed-zeros", "-fassociative-math", "-ffp-contract=fast", "-std=c11")
#: added where the CPU has AVX-512 (x86): -march=native keeps GCC's auto-vectoriser at 256-bit vectors on
#: most AVX-512 parts; at 512 the shipped loops took 0.7x the time on a 2-core Xeon (the same results file)
WIDE_VECTORS = ("-mprefer-vector-width=512",)
_lock = threading.Lock()
_loaded: dict[Path, ctypes.CDLL | None] = {}
_reasons: dict[Path, str] = {}
_pool: ThreadPoolExecutor | None = None


def enabled() -> bool:
    """False when ``HPCBENCH_C_KERNELS`` is 0/false/no/off (the torch paths run everywhere)."""
    return os.environ.get("HPCBENCH_C_KERNELS", "1").strip().lower() not in ("0", "false", "no", "off")


def _compiler() -> list[str] | None:
    """The compiler command: ``CC`` (split like a shell would) when it names a program on PATH, else cc,
    gcc or clang. A ``CC`` that names nothing usable is said, not silently replaced."""
    env = os.environ.get("CC", "").strip()
    if env:
        cmd = shlex.split(env)
        if cmd and shutil.which(cmd[0]):
            return cmd
        log.warning("CC=%r names no program on PATH; trying cc, gcc, clang", env)
    for name in ("cc", "gcc", "clang"):
        if shutil.which(name):
            return [name]
    return None


def _cpu_id() -> str:
    """The CPU's model name and flags (what -march=native compiles for)."""
    try:
        text = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        return platform.machine() + platform.processor()
    model = flags = ""
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key in ("model name", "Processor") and not model:
            model = value.strip()
        elif key in ("flags", "Features") and not flags:
            flags = " ".join(sorted(value.split()))
    return f"{platform.machine()}|{model}|{flags}"


def cflags(cpu_id: str | None = None) -> tuple[str, ...]:
    """The compiler flags for this CPU (``cpu_id`` as :func:`_cpu_id` gives it): CFLAGS, and WIDE_VECTORS on
    an x86 CPU with AVX-512 Foundation."""
    arch, _, rest = (cpu_id if cpu_id is not None else _cpu_id()).partition("|")
    flags = rest.rpartition("|")[2].split()
    if arch.lower() in ("x86_64", "amd64") and "avx512f" in flags:
        return CFLAGS + WIDE_VECTORS
    return CFLAGS


def _cache_dir() -> Path:
    env = os.environ.get("HPCBENCH_KERNEL_CACHE")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "hpcbench" / "kernels"


def _private_dir(folder: Path) -> bool:
    """A real directory (not a link) owned by this user that no one else can write."""
    st = os.lstat(folder)
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid() and not st.st_mode & 0o022


def _writable(folder: Path) -> Path:
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe = tempfile.NamedTemporaryFile(dir=folder, prefix=".probe.", delete=True)
        probe.close()
        return folder
    except OSError as exc:
        fallback = Path(tempfile.gettempdir()) / f"hpcbench-kernels-{os.getuid()}"
        try:
            fallback.mkdir(mode=0o700, exist_ok=True)
            if _private_dir(fallback):
                return fallback
        except OSError:
            pass
        raise OSError(f"cache folder {folder} is not writable ({exc}) and {fallback} is not this user's "
                      "private directory") from exc


def _build(source: Path, cc: list[str], dest: Path, symbols: tuple[str, ...]) -> ctypes.CDLL:
    """Compile to a temporary sibling, load it, check the symbols, make it readable as a plain file would
    be, rename it into place; the handle returned is the one loaded from the checked file."""
    fd, tmp_name = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".tmp", dir=dest.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        proc = subprocess.run([*cc, *cflags(), "-o", str(tmp), str(source)], capture_output=True, text=True,
                              timeout=BUILD_TIMEOUT_S, check=False)
        if proc.returncode != 0:
            raise RuntimeError(f"{' '.join(cc)} failed on {source} (exit {proc.returncode}): "
                               f"{proc.stderr.strip()[-800:]}")
        lib = ctypes.CDLL(str(tmp))
        missing = [s for s in symbols if not hasattr(lib, s)]
        if missing:
            raise RuntimeError(f"{source} built without {', '.join(missing)}")
        mode = file_mode()  # a plain file's mode under the umask, plus execute where it is readable
        os.chmod(tmp, mode | (mode & 0o444) >> 2)
        os.replace(tmp, dest)
        return lib
    finally:
        tmp.unlink(missing_ok=True)


def load(source: Path, symbols: tuple[str, ...]) -> ctypes.CDLL | None:
    """The built library of C file ``source`` with every name in ``symbols``, or None (see :func:`reason`)."""
    with _lock:
        if source in _loaded:
            return _loaded[source]
        lib, why = None, ""
        if not enabled():
            why = "HPCBENCH_C_KERNELS is off"
        elif (cc := _compiler()) is None:
            why = "no C compiler (cc, gcc, clang or $CC) on PATH"
        else:
            try:
                text = source.read_bytes()
                version = subprocess.run([*cc, "--version"], capture_output=True, text=True, timeout=60,
                                         check=False).stdout.splitlines()[:1]
                key = hashlib.sha256(b"\0".join([text, " ".join(cflags()).encode(), repr(version).encode(),
                                                 _cpu_id().encode(), sys.implementation.cache_tag.encode()]))
                dest = _writable(_cache_dir()) / f"{source.stem}-{key.hexdigest()[:20]}.so"
                if dest.is_file():
                    try:
                        lib = ctypes.CDLL(str(dest))
                        if not all(hasattr(lib, s) for s in symbols):
                            lib = None
                    except OSError:
                        lib = None  # damaged or foreign: rebuilt below
                if lib is None:
                    lib = _build(source, cc, dest, symbols)
            except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
                lib, why = None, f"could not build {source.name}: {exc}"
        _loaded[source] = lib
        if lib is None:
            _reasons[source] = why
            # a deliberate switch-off is not news; a machine that could build and did not is
            (log.info if not enabled() else log.warning)("C kernel %s not used (%s); the torch path runs",
                                                         source.name, why)
        return lib


def reason(source: Path) -> str:
    """Why :func:`load` gave None for ``source`` ("" when it loaded or was not asked)."""
    return _reasons.get(source, "")


def _forget_pool() -> None:
    """In a forked child the parent's worker threads do not exist: start a new pool there."""
    global _pool, _lock
    _pool = None
    _lock = threading.Lock()


os.register_at_fork(after_in_child=_forget_pool)


def spans(n: int, threads: int, min_per_thread: int) -> list[tuple[int, int]]:
    """``n`` rows cut into at most ``threads`` contiguous spans of at least ``min_per_thread`` rows (one span
    when there are fewer; the cut depends only on these numbers, so results do not depend on timing)."""
    count = max(1, min(threads, n // min_per_thread))
    cuts = [n * i // count for i in range(count + 1)]
    return list(zip(cuts[:-1], cuts[1:]))


def run_spans(spans: list[tuple[int, int]], work: Callable[[int, int, int], None]) -> None:
    """``work(i, start, end)`` for each span i, on a thread each when there are several (a ctypes call
    releases the GIL, so C kernels on disjoint spans run in parallel); the first error is raised."""
    global _pool
    if len(spans) == 1:
        work(0, *spans[0])
        return
    with _lock:
        if _pool is None or _pool._max_workers < len(spans):  # noqa: SLF001
            _pool = ThreadPoolExecutor(max_workers=len(spans), thread_name_prefix="ckernel")
        pool = _pool
    for f in [pool.submit(work, i, s, e) for i, (s, e) in enumerate(spans)]:
        f.result()


def address(t: Any, row: int = 0) -> ctypes.c_void_p:
    """The address of row ``row`` of a tensor whose rows are ``stride(0)`` elements apart (NULL for None)."""
    if t is None:
        return ctypes.c_void_p(None)
    return ctypes.c_void_p(t.data_ptr() + row * t.stride(0) * t.element_size())


def row_strided(t: Any) -> Any:
    """``t`` itself when it is a matrix with unit-strided columns (a column slice of a wider matrix: a C loop
    reads it with its row stride, ``t.stride(0)``), else a contiguous copy (none when it already is)."""
    return t if t.dim() == 2 and t.stride(1) == 1 else t.contiguous()


def private_targets(out: Any, count: int) -> list[Any]:
    """For a kernel that ACCUMULATES into ``out`` over ``count`` spans: ``out`` for span 0 and a zeroed twin
    for each further span (threads never share a row they both write), summed by :func:`sum_targets`."""
    if out is None:
        return [None] * count
    return [out] + [out.new_zeros(out.shape) for _ in range(count - 1)]


def sum_targets(parts: list[Any]) -> None:
    """Adds the spans' twins into ``parts[0]`` in span order (a fixed order: the sum does not depend on timing)."""
    for extra in parts[1:]:
        parts[0].add_(extra)
