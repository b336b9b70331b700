"""capfs: an emulated shared filesystem with one bandwidth cap that every reader shares.

A read-only FUSE passthrough of a folder, served by a separate process (not the measured one) that
speaks the kernel's FUSE protocol on ``/dev/fuse`` directly (no libfuse needed). Every file is
opened with ``FOPEN_DIRECT_IO``, so the kernel's page cache never holds its data: each read of each
reader (a re-read by a second emulated instance included) goes to the server, and the server answers
READs through one token bucket (``--mbps``, MB/s = 1e6 bytes/s). That is a shared filesystem whose
servers or links are the bottleneck: copy, the v1.0 way and packed staging pay alike per byte.

Start and stop (root, ``/dev/fuse``; see docs/staging.md)::

    python -m benchmarks.capfs start --backing /data/packed --mount /mnt/shared --mbps 100
    python -m benchmarks.capfs stop --mount /mnt/shared     # prints bytes served, unmounts, waits

From Python: ``with CappedMount(backing, mount, mbps) as m: ...`` (``m.stats()`` reads the counters).
:func:`unavailable` says why the mechanism cannot be used here (no ``/dev/fuse``, not root, mount refused).
"""
from __future__ import annotations

import argparse
import ctypes
import errno
import json
import os
import signal
import stat
import struct
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

IN_HDR = struct.Struct("<IIQQIIIHH")  # len, opcode, unique, nodeid, uid, gid, pid, total_extlen, padding
OUT_HDR = struct.Struct("<IiQ")  # len, error, unique
ATTR = struct.Struct("<6Q10I")  # ino size blocks atime mtime ctime *nsec mode nlink uid gid rdev blksize flags
ENTRY = struct.Struct("<QQQQII")  # nodeid generation entry_valid attr_valid *_nsec (+ attr)
READ_IN = struct.Struct("<QQII")  # fh offset size read_flags (lock_owner, flags follow)
OPEN_OUT = struct.Struct("<QIi")  # fh open_flags backing_id
DIRENT = struct.Struct("<QQII")  # ino off namelen type (+ name, padded to 8)
KSTATFS = struct.Struct("<QQQQQIIII24x")
LOOKUP, FORGET, GETATTR, OPEN, READ, STATFS, RELEASE, FLUSH, INIT = 1, 2, 3, 14, 15, 17, 18, 25, 26
OPENDIR, READDIR, RELEASEDIR, ACCESS, INTERRUPT, DESTROY, BATCH_FORGET = 27, 28, 29, 34, 36, 38, 42
NO_REPLY = (FORGET, BATCH_FORGET, INTERRUPT)
FOPEN_DIRECT_IO, FUSE_ASYNC_READ, FUSE_MAX_PAGES = 1, 1, 1 << 22
MAX_READ = 1 << 20  # bytes per READ request (256 pages)
STATS_EVERY_S = 0.5


class TokenBucket:
    """``rate`` bytes/s with ``burst`` bytes of credit: :meth:`take` sleeps until ``n`` bytes fit."""

    def __init__(self, rate: float, burst: float) -> None:
        self.rate, self.burst = rate, burst
        self.tokens, self.t = burst, time.monotonic()

    def take(self, n: int) -> float:
        now = time.monotonic()
        self.tokens = min(self.burst, self.tokens + (now - self.t) * self.rate) - n
        self.t = now
        wait = -self.tokens / self.rate if self.tokens < 0 else 0.0
        if wait > 0:
            time.sleep(wait)
        return wait


class Server:
    """The FUSE request loop (single-threaded: requests are served in arrival order, like one link)."""

    def __init__(self, fd: int, backing: Path, bucket: TokenBucket, stats_path: Path | None) -> None:
        self.fd, self.backing, self.bucket, self.stats_path = fd, backing, bucket, stats_path
        self.paths: dict[int, Path] = {1: backing}
        self.ids: dict[Path, int] = {backing: 1}
        self.files: dict[int, int] = {}
        self.dirs: dict[int, list[tuple[str, int, int]]] = {}
        self.next_fh = 1
        self.served = {"read_bytes": 0, "read_requests": 0, "opens": 0, "throttled_s": 0.0}
        self.last_stats = 0.0

    def _attr(self, p: Path) -> bytes:
        s = os.lstat(p)
        return ATTR.pack(self._id(p), s.st_size, s.st_blocks, int(s.st_atime), int(s.st_mtime), int(s.st_ctime),
                         0, 0, 0, s.st_mode & ~0o222, s.st_nlink, s.st_uid, s.st_gid, 0, 4096, 0)

    def _id(self, p: Path) -> int:
        if p not in self.ids:
            self.ids[p] = len(self.paths) + 1
            self.paths[self.ids[p]] = p
        return self.ids[p]

    def _reply(self, unique: int, err: int = 0, body: bytes = b"") -> None:
        try:
            os.write(self.fd, OUT_HDR.pack(OUT_HDR.size + len(body), -err, unique) + body)
        except OSError as exc:
            if exc.errno != errno.ENOENT:  # ENOENT: the request was interrupted meanwhile
                raise

    def _handle(self, op: int, node: int, arg: bytes) -> tuple[int, bytes]:
        if op == INIT:
            major, minor, _readahead, flags = struct.unpack_from("<IIII", arg)
            want = flags & (FUSE_ASYNC_READ | FUSE_MAX_PAGES)
            body = struct.pack("<IIIIHHIIHH", 7, min(minor, 31), 0, want, 16, 12, MAX_READ, 1, MAX_READ // 4096, 0)
            return 0, body.ljust(64, b"\0")
        path = self.paths.get(node)
        if path is None:
            return errno.ESTALE, b""
        if op == LOOKUP:
            child = path / arg.split(b"\0", 1)[0].decode()
            return 0, ENTRY.pack(self._id(child), 0, 1, 1, 0, 0) + self._attr(child)
        if op == GETATTR:
            return 0, struct.pack("<QII", 1, 0, 0) + self._attr(path)
        if op == OPEN:
            if struct.unpack_from("<I", arg)[0] & os.O_ACCMODE != os.O_RDONLY:
                return errno.EROFS, b""
            fh, self.next_fh = self.next_fh, self.next_fh + 1
            self.files[fh] = os.open(path, os.O_RDONLY)
            self.served["opens"] += 1
            return 0, OPEN_OUT.pack(fh, FOPEN_DIRECT_IO, 0)
        if op == READ:
            fh, off, size, _ = READ_IN.unpack_from(arg)
            data = os.pread(self.files[fh], size, off)
            self.served["throttled_s"] += self.bucket.take(len(data))
            self.served["read_bytes"] += len(data)
            self.served["read_requests"] += 1
            return 0, data
        if op in (RELEASE, RELEASEDIR):
            fh = struct.unpack_from("<Q", arg)[0]
            if fh in self.files:
                os.close(self.files.pop(fh))
            self.dirs.pop(fh, None)
            return 0, b""
        if op in (FLUSH, ACCESS):
            return 0, b""
        if op == OPENDIR:
            fh, self.next_fh = self.next_fh, self.next_fh + 1
            ents = [(".", node, stat.S_IFDIR), ("..", 1, stat.S_IFDIR)]
            for e in sorted(os.scandir(path), key=lambda e: e.name):
                ents.append((e.name, self._id(Path(e.path)), stat.S_IFMT(e.stat(follow_symlinks=False).st_mode)))
            self.dirs[fh] = ents
            return 0, OPEN_OUT.pack(fh, 0, 0)
        if op == READDIR:
            fh, off, size, _ = READ_IN.unpack_from(arg)
            out = bytearray()
            for i, (name, ino, typ) in enumerate(self.dirs.get(fh, [])[off:], start=off):
                raw = name.encode()
                ent = DIRENT.pack(ino, i + 1, len(raw), typ >> 12) + raw
                ent += b"\0" * (-len(ent) % 8)
                if len(out) + len(ent) > size:
                    break
                out += ent
            return 0, bytes(out)
        if op == STATFS:
            v = os.statvfs(path)
            return 0, KSTATFS.pack(v.f_blocks, v.f_bfree, v.f_bavail, v.f_files, v.f_ffree, v.f_bsize, 255,
                                   v.f_frsize, 0)
        return errno.ENOSYS, b""

    def _write_stats(self, force: bool = False) -> None:
        now = time.monotonic()
        if self.stats_path is None or (not force and now - self.last_stats < STATS_EVERY_S):
            return
        self.last_stats = now
        tmp = self.stats_path.with_name(self.stats_path.name + ".tmp")
        tmp.write_text(json.dumps(self.served))
        os.replace(tmp, self.stats_path)

    def serve(self) -> None:
        while True:
            try:
                req = os.read(self.fd, MAX_READ + 65536)
            except OSError as exc:
                if exc.errno == errno.EINTR or exc.errno == errno.ENOENT:
                    continue
                if exc.errno == errno.ENODEV:  # unmounted
                    break
                raise
            _, op, unique, node = IN_HDR.unpack_from(req)[:4]
            if op in NO_REPLY:
                continue
            if op == DESTROY:
                self._reply(unique)
                break
            try:
                err, body = self._handle(op, node, req[IN_HDR.size:])
            except OSError as exc:
                err, body = exc.errno or errno.EIO, b""
            except Exception as exc:  # noqa: BLE001 - a bug must not take the mount down: EIO, logged
                print(f"capfs: opcode {op}: {exc!r}", file=sys.stderr, flush=True)
                err, body = errno.EIO, b""
            self._reply(unique, err, body)
            self._write_stats()
        self._write_stats(force=True)


def _libc() -> Any:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mount.argtypes = [ctypes.c_char_p] * 3 + [ctypes.c_ulong, ctypes.c_char_p]
    libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]
    return libc


def fuse_mount(mount: Path) -> int:
    """Open /dev/fuse and mount it read-only at ``mount``; returns the fd (the server's end)."""
    fd = os.open("/dev/fuse", os.O_RDWR)
    opts = f"fd={fd},rootmode=40000,user_id={os.getuid()},group_id={os.getgid()},allow_other,max_read={MAX_READ}"
    MS_RDONLY, MS_NOSUID, MS_NODEV = 1, 2, 4
    if _libc().mount(b"capfs", str(mount).encode(), b"fuse.capfs", MS_RDONLY | MS_NOSUID | MS_NODEV, opts.encode()):
        e = ctypes.get_errno()
        os.close(fd)
        raise OSError(e, f"mounting a FUSE filesystem at {mount}: {os.strerror(e)}")
    return fd


def fuse_unmount(mount: Path) -> None:
    MNT_DETACH = 2
    if _libc().umount2(str(mount).encode(), MNT_DETACH):
        e = ctypes.get_errno()
        if e not in (errno.EINVAL, errno.ENOENT):  # EINVAL: not mounted (any more)
            raise OSError(e, f"unmounting {mount}: {os.strerror(e)}")


def unavailable() -> str | None:
    """Why capfs cannot run here (None when it can): checked, not assumed."""
    if not os.path.exists("/dev/fuse"):
        return "/dev/fuse does not exist (no FUSE in this kernel or container)"
    if os.geteuid() != 0:
        return "mounting a FUSE filesystem without libfuse's fusermount needs root (euid is not 0)"
    if not os.access("/dev/fuse", os.R_OK | os.W_OK):
        return "/dev/fuse is not readable and writable"
    return None


class CappedMount:
    """Starts the server process on ``backing`` at ``mount`` with ``mbps`` MB/s; stops it on exit."""

    def __init__(self, backing: Path, mount: Path, mbps: float, burst_mb: float = 1.0) -> None:
        if not mbps > 0:
            raise ValueError(f"--mbps must be > 0, got {mbps}")
        self.backing, self.mount, self.mbps, self.burst_mb = backing.resolve(), mount, mbps, burst_mb
        self.stats_path = Path(f"{mount}.capfs-stats.json")
        self.log_path = Path(f"{mount}.capfs-log")
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, wait_s: float = 10.0) -> CappedMount:
        self.mount.mkdir(parents=True, exist_ok=True)
        if os.path.ismount(self.mount):
            raise OSError(errno.EBUSY, f"{self.mount} is already a mount point (a capfs left running? "
                                       f"python -m benchmarks.capfs stop --mount {self.mount})")
        self.proc = subprocess.Popen([sys.executable, "-m", "benchmarks.capfs", "serve", "--backing", str(self.backing),
                                      "--mount", str(self.mount), "--mbps", str(self.mbps),
                                      "--burst-mb", str(self.burst_mb)],
                                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=open(self.log_path, "wb"), start_new_session=True, cwd=Path(__file__).resolve().parents[1])
        t0 = time.monotonic()
        while not os.path.ismount(self.mount):
            if self.proc.poll() is not None:
                err = self.log_path.read_text().strip()
                raise OSError(f"capfs server exited with status {self.proc.returncode}: {err}")
            if time.monotonic() - t0 > wait_s:
                self.stop()
                raise TimeoutError(f"capfs did not mount {self.mount} within {wait_s} s")
            time.sleep(0.02)
        Path(f"{self.mount}.capfs-pid").write_text(str(self.proc.pid))
        return self

    def stats(self) -> dict[str, Any]:
        try:
            return json.loads(self.stats_path.read_text())
        except (OSError, ValueError):
            return {}

    def stop(self, wait_s: float = 10.0) -> dict[str, Any]:
        return stop(self.mount, self.proc, wait_s)

    def __enter__(self) -> CappedMount:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def stop(mount: Path, proc: subprocess.Popen[bytes] | None = None, wait_s: float = 10.0) -> dict[str, Any]:
    """Unmount (lazily: open files keep working until closed), wait for the server to exit, return its counters."""
    fuse_unmount(mount)
    pid_file = Path(f"{mount}.capfs-pid")
    if proc is not None:
        try:
            proc.wait(wait_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    elif pid_file.exists():
        pid = int(pid_file.read_text())
        t0 = time.monotonic()
        while _alive(pid) and time.monotonic() - t0 < wait_s:
            time.sleep(0.05)
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)
    pid_file.unlink(missing_ok=True)
    stats_path = Path(f"{mount}.capfs-stats.json")
    try:
        out = json.loads(stats_path.read_text())
    except (OSError, ValueError):
        out = {}
    stats_path.unlink(missing_ok=True)
    return out


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie of ours counts as gone
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name in ("serve", "start"):
        p = sub.add_parser(name)
        p.add_argument("--backing", type=Path, required=True, help="folder to serve (read-only)")
        p.add_argument("--mount", type=Path, required=True, help="mount point (made if missing)")
        p.add_argument("--mbps", type=float, required=True, help="shared read cap, MB/s (1e6 bytes/s)")
        p.add_argument("--burst-mb", type=float, default=1.0, help="token-bucket depth, MB")
    sub.add_parser("stop").add_argument("--mount", type=Path, required=True)
    a = ap.parse_args(argv)
    if a.cmd == "stop":
        print(json.dumps(stop(a.mount)))
        return 0
    if not a.backing.is_dir():
        ap.error(f"--backing {a.backing}: not a folder")
    if a.cmd == "start":
        why = unavailable()
        if why:
            print(f"capfs: cannot start: {why}", file=sys.stderr)
            return 2
        m = CappedMount(a.backing, a.mount, a.mbps, a.burst_mb).start()
        assert m.proc is not None
        print(f"capfs: {a.backing} served read-only at {a.mount}, capped at {a.mbps:g} MB/s (pid {m.proc.pid}); "
              f"stop with: python {__file__} stop --mount {a.mount}")
        return 0
    # serve: the server process itself (started by CappedMount)
    fd = fuse_mount(a.mount)
    signal.signal(signal.SIGTERM, lambda *_: fuse_unmount(a.mount))
    bucket = TokenBucket(a.mbps * 1e6, a.burst_mb * 1e6)
    Server(fd, a.backing.resolve(), bucket, Path(f"{a.mount}.capfs-stats.json")).serve()
    return 0


if __name__ == "__main__":
    sys.exit(main())
