"""Move one split's shards to node-local storage: sharded reads + chunked Allgatherv + overlapped writes.

The group of nodes that need the same shard-set agree (union) on which shards still need staging.
Each member's *stream* is the concatenation of the shards it reads; round r moves bytes
[r*C, (r+1)*C) of every stream with one ``Iallgatherv`` (C keeps every count and displacement below
MPI's 2**31 limit). While round r is in flight, a reader thread fetches round r+1 from shared
storage, and a thread pool decompresses and writes the files completed by earlier rounds.

Every receiver checks what it keeps: a shard's header against the manifest's header crc32c before it
is decoded, every frame and member after decompression, and the whole shard against the manifest's
crc32c once all its bytes are in; only then are the shard's members renamed into place.
"""
from __future__ import annotations

import threading
import time

import crc32c
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hpcbench.common.dist import mpi
from hpcbench.common.errors import DataError

from .exchange import agree, wait
from .manifest import FileEntry, ShardInfo, decode_header, header_size
from .nodelocal import FileAssembly, Journal, sync_all, target
from .plan import SplitPlan

INT_MAX = 2**31 - 1


def round_bytes(chunk_bytes: int, group_size: int) -> int:
    """Bytes per member per Allgatherv round: every count and displacement (and so the whole
    receive buffer) must stay below MPI's 2**31 int limit."""
    return max(1, min(chunk_bytes, INT_MAX // max(1, group_size)))


@dataclass
class Stats:
    read_bytes: int = 0
    read_shards: int = 0
    sent_bytes: int = 0
    recv_bytes: int = 0
    write_bytes: int = 0
    write_files: int = 0
    skipped_shards: int = 0
    repaired_files: int = 0  # staged files that --verify found damaged and staged again
    removed_files: int = 0  # files of another dataset or layout removed from the dest
    rounds: int = 0
    times: dict[str, float] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add_time(self, k: str, s: float) -> None:
        with self.lock:
            self.times[k] = self.times.get(k, 0.0) + s


@dataclass
class Ctx:
    source: Path
    dest: Path
    node: int
    journal: Journal
    pool: ThreadPoolExecutor
    stats: Stats
    chunk_bytes: int
    timeout_s: float
    mem_limit: int
    poll_s: float = 5e-4  # longest pause between MPI progress polls during a transfer (1e-3..5e-5 measured alike)


class _ShardBuf:
    def __init__(self, info: ShardInfo) -> None:
        self.info = info
        self.buf = bytearray(info.bytes)
        self.got = 0
        self.files: list[FileEntry] | None = None
        self.next = 0
        self.left = -1  # files not yet written; -1 until the header is known
        self.lock = threading.Lock()
        self.ready: list[FileAssembly] = []  # checked temporaries waiting for the shard checksum
        self.failed = False
        self.finished = False


def _truncation_error(path: Path, info: ShardInfo, size: int) -> str:
    where = f"shard {info.name}"
    if size > info.bytes:
        return (f"wrong size of {where} ({path}): {size} bytes on disk, manifest says {info.bytes} "
                f"({size - info.bytes} bytes too many); restore or repack it")
    try:
        with open(path, "rb") as fh:
            files = decode_header(fh.read(info.header_bytes), where)
        cut = next((f.name for f in files if f.end > size), None)
    except (DataError, OSError):
        cut = None
    member = f"member {cut} is cut off" if cut else "the shard header itself is cut off"
    return f"truncated {where} ({path}): {size} bytes on disk, manifest says {info.bytes}; {member}"


class _Reader:
    """Reads byte ranges of this member's stream (its shards, back to back) from shared storage."""

    def __init__(self, ctx: Ctx, shards: list[ShardInfo]) -> None:
        self.ctx, self.shards = ctx, shards
        self.starts = [sum(s.bytes for s in shards[:i]) for i in range(len(shards))]
        self.fh: Any = None
        self.open_idx = -1

    def preflight(self) -> str | None:
        for s in self.shards:
            p = self.ctx.source / s.name
            if not p.is_file():
                return f"shard {s.name} is missing from {self.ctx.source}"
            if p.stat().st_size != s.bytes:
                return _truncation_error(p, s, p.stat().st_size)
        return None

    def read(self, start: int, count: int) -> bytes:
        t0 = time.perf_counter()
        out = bytearray()
        for i, s in enumerate(self.shards):
            a, b = self.starts[i], self.starts[i] + s.bytes
            lo, hi = max(a, start), min(b, start + count)
            if lo >= hi:
                continue
            if self.open_idx != i:
                if self.fh:
                    self.fh.close()
                self.fh, self.open_idx = open(self.ctx.source / s.name, "rb", buffering=0), i
                self.ctx.stats.read_shards += 1
            self.fh.seek(lo - a)
            data = self.fh.read(hi - lo)
            if len(data) != hi - lo:
                raise DataError(_truncation_error(self.ctx.source / s.name, s, lo - a + len(data)))
            out += data
        self.ctx.stats.read_bytes += len(out)
        self.ctx.stats.add_time("read_s", time.perf_counter() - t0)
        return bytes(out)

    def close(self) -> None:
        if self.fh:
            self.fh.close()


class SplitExchange:
    def __init__(self, ctx: Ctx, plan: SplitPlan, comm: Any, member: int, mine: list[int], union: list[int]) -> None:
        self.ctx, self.plan, self.comm, self.member = ctx, plan, comm, member
        self.mine = set(mine)
        self.streams = [[plan.shards[i] for i in r] for r in plan.readers(union)]
        self.stream_idx = [r for r in plan.readers(union)]
        self.lengths = [sum(s.bytes for s in st) for st in self.streams]
        self.starts = [[sum(s.bytes for s in st[:i]) for i in range(len(st))] for st in self.streams]
        g = comm.Get_size()
        self.chunk = round_bytes(ctx.chunk_bytes, g)
        self.rounds = -(-max(self.lengths, default=0) // self.chunk)
        self.bufs: dict[int, _ShardBuf] = {}
        self.futures: list[Future] = []
        self.buffered = 0
        self.errors: list[str] = []
        self.elock = threading.Lock()

    # receiving side ---------------------------------------------------------------------------
    def _place(self, m: int, start: int, data: memoryview) -> None:
        for k, s, a in zip(self.stream_idx[m], self.streams[m], self.starts[m]):
            lo, hi = max(a, start), min(a + s.bytes, start + len(data))
            if lo >= hi:
                continue
            if k in self.mine:
                sb = self.bufs.get(k)
                if sb is None:
                    sb = self.bufs[k] = _ShardBuf(s)
                    self.buffered += s.bytes
                sb.buf[lo - a: hi - a] = data[lo - start: hi - start]
                sb.got = max(sb.got, hi - a)
                self._dispatch(k, sb)
                self._maybe_finish(k, sb)

    def _dispatch(self, k: int, sb: _ShardBuf) -> None:
        where = f"shard {sb.info.name}"
        if sb.files is None:
            if sb.got < sb.info.header_bytes:
                return
            files = decode_header(memoryview(sb.buf)[: sb.info.header_bytes], where, crc=sb.info.header_crc32c)
            if header_size(bytes(sb.buf[:12]), where) != sb.info.header_bytes or len(files) != sb.info.files:
                raise DataError(f"corrupt {where}: header does not match the manifest")
            sb.files, sb.left = files, len(files)
        view = memoryview(sb.buf)
        while sb.next < len(sb.files) and sb.files[sb.next].end <= sb.got:
            f = sb.files[sb.next]
            sb.next += 1
            if f.end > sb.info.bytes:
                raise DataError(f"corrupt {where}: member {f.name} points past the end of the shard")
            asm = FileAssembly(target(self.ctx.dest, f.name, where), f, self.ctx.node)
            for fr in f.frames:
                self.futures.append(self.ctx.pool.submit(self._write, view, fr, asm, k, sb))

    def _write(self, view: memoryview, fr: Any, asm: FileAssembly, k: int, sb: _ShardBuf) -> None:
        t0 = time.perf_counter()
        try:
            if sb.failed:
                asm.abort()
                return
            if not asm.write_frame(view, fr, sb.info.name):
                return
            with sb.lock:
                sb.ready.append(asm)
                sb.left -= 1
            self._maybe_finish(k, sb)
        except DataError as exc:
            self._fail(sb, str(exc))
        finally:
            self.ctx.stats.add_time("write_thread_s", time.perf_counter() - t0)

    def _fail(self, sb: _ShardBuf, msg: str) -> None:
        """Drop every checked temporary of a failed shard (nothing of it appears under its name)."""
        with sb.lock:
            sb.failed = True
            ready, sb.ready = sb.ready, []
        for a in ready:
            a.abort()
        with self.elock:
            self.errors.append(msg)

    def _maybe_finish(self, k: int, sb: _ShardBuf) -> None:
        """Once all bytes are in and every member is checked: the shard's crc32c, then rename all."""
        with sb.lock:
            if sb.finished or sb.failed or sb.left != 0 or sb.got < sb.info.bytes:
                return
            sb.finished = True
        if crc32c.crc32c(sb.buf) != sb.info.crc32c:
            self._fail(sb, f"corrupt shard {sb.info.name}: its bytes fail the manifest's crc32c check")
            return
        try:
            sync_all(sb.ready)  # durable before any rename: a renamed file is complete on disk
            for a in sb.ready:
                a.commit()
        except DataError as exc:
            self._fail(sb, str(exc))
            return
        st = self.ctx.stats
        with st.lock:
            st.write_bytes += sum(a.entry.size for a in sb.ready)
            st.write_files += len(sb.ready)
        self.ctx.journal.record(sb.info, sb.files or [])
        sb.buf, sb.ready = bytearray(), []  # release the compressed bytes
        self.bufs.pop(k, None)
        with self.elock:
            self.buffered -= sb.info.bytes

    def _discard(self) -> None:
        """After a failure: remove the temporaries of shards that never completed."""
        for sb in list(self.bufs.values()):
            with sb.lock:
                sb.failed = True
                ready, sb.ready = sb.ready, []
            for a in ready:
                a.abort()

    def _pending_error(self) -> str | None:
        with self.elock:
            return self.errors[0] if self.errors else None

    def _backpressure(self) -> None:
        while self.buffered > self.ctx.mem_limit and any(not f.done() for f in self.futures):
            next(f for f in self.futures if not f.done()).result()
        self.futures = [f for f in self.futures if not f.done()]

    # the loop -----------------------------------------------------------------------------------
    def run(self) -> None:
        MPI = mpi()
        g, c, ctx = self.comm.Get_size(), self.chunk, self.ctx
        reader = _Reader(ctx, self.streams[self.member])
        what = f"staging split {self.plan.split}"
        agree(self.comm, reader.preflight(), ctx.timeout_s, f"{what}: checking shards")
        io = ThreadPoolExecutor(1)
        nxt: Future | None = None
        try:
            def count(m: int, r: int) -> int:
                return max(0, min(c, self.lengths[m] - r * c))

            if self.rounds:
                nxt = io.submit(reader.read, 0, count(self.member, 0))
            for r in range(self.rounds):
                err = self._pending_error()
                piece = b""
                if err is None:
                    try:
                        piece = nxt.result()
                    except (DataError, OSError) as exc:
                        err = str(exc)
                agree(self.comm, err, ctx.timeout_s, f"{what}: round {r}")
                counts = [count(m, r) for m in range(g)]
                displs = [sum(counts[:m]) for m in range(g)]
                recv = bytearray(max(1, sum(counts)))
                t0 = time.perf_counter()
                req = self.comm.Iallgatherv([piece, MPI.BYTE], [recv, counts, displs, MPI.BYTE])
                if r + 1 < self.rounds:
                    nxt = io.submit(reader.read, (r + 1) * c, count(self.member, r + 1))
                wait(req, ctx.timeout_s, f"{what}: Allgatherv round {r + 1}/{self.rounds}", ctx.poll_s)
                ctx.stats.add_time("transfer_s", time.perf_counter() - t0)
                ctx.stats.sent_bytes += len(piece)
                ctx.stats.recv_bytes += sum(counts) - len(piece)
                ctx.stats.rounds += 1
                view = memoryview(recv)
                try:
                    for m in range(g):
                        self._place(m, r * c, view[displs[m]: displs[m] + counts[m]])
                except DataError as exc:
                    with self.elock:
                        self.errors.append(str(exc))
                self._backpressure()
            t0 = time.perf_counter()
            for f in self.futures:
                f.result()
            ctx.stats.add_time("drain_s", time.perf_counter() - t0)
            if not self._pending_error():
                incomplete = [sb.info.name for sb in self.bufs.values()]
                if incomplete:
                    with self.elock:
                        self.errors.append(f"node {ctx.node}: shard {incomplete[0]} was not received completely")
        finally:
            for f in self.futures:  # the writers finish (or fail) before their temporaries are dropped
                f.exception()
            if nxt is not None:
                nxt.exception()
            io.shutdown(wait=True)
            reader.close()
            if self._pending_error() or self.bufs:
                self._discard()
        agree(self.comm, self._pending_error(), ctx.timeout_s, f"{what}: final check")
