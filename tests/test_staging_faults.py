"""The staging fault matrix (issue #12): every case runs ``hpcbench stage`` under mpiexec on tiny
packed CosmoFlow data and is classified. A case that should succeed must exit 0 with every staged
file equal, byte for byte, to the raw source (and each instance holding the whole dataset); a case
that should fail must exit non-zero with its named error printed once, no traceback, no completion
marker and no temporary file left, within its time bound. The summary line counts cases, silent
wrong results, hangs past the timeout and tracebacks (all but the first must be 0)."""
from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import uuid

import pytest

from benchmarks.synth_data import write_cosmoflow
from hpcbench.common.errors import DataError
from hpcbench import registry
from hpcbench.staging.guard import STOP_GRACE_S
from hpcbench.staging.manifest import MANIFEST, Manifest, decode_header
from hpcbench.staging.marker import check_staged
from hpcbench.staging.pack import Packer
from tests.conftest import mpiexec_path, one_member_pack, project_env

pytestmark = pytest.mark.mpi
TIMEOUT = 3  # --timeout of the runs that expect an error (their hang bound is this plus GRACE_S)
# --timeout of the runs that expect success: the watchdog is not what they test, and on an oversubscribed box
# (three cases of up to 8 ranks beside another test worker, on 2 cores) a rank can make no progress for 3 s while
# the others wait: on 2026-12-02 "ok 2 ranks per node, 1 node per instance" was aborted that way ("no progress
# for 3s while exchanging the layout"). A real hang still ends at HANG_S.
QUIET_TIMEOUT = 30
GRACE_S = 10  # start-up, the abort's stagger and drain: a run past its --timeout plus this is a hang
HANG_S = 40  # a run is killed here
MARKER = Path(".hpcbench") / "staged_manifest.json"


@dataclass
class Case:
    name: str
    args: list[str]  # after `stage` (--source/--dest are added unless "--source" is given)
    expect: str | None = None  # None: success; else a substring of the one error message
    n: int = 4
    setup: Callable[[Path, "Data"], None] | None = None  # prepares the case folder (dest, source copies)
    fault: str | None = None  # KIND:RANK:ROUND for tests/stage_fault_job.py
    source: str = "packed"  # which prepared source folder (relative to the case folder or data root)
    once: bool = True  # the error message must appear exactly once (False: at most once, e.g. a rank dies)
    marker_ok: bool = False  # a failure after the data were completely staged (the marker stays)
    umask: int | None = None
    check: Callable[[Path, "Data"], str | None] | None = None  # extra check; returns a problem or None
    grace: float = 0.0  # more time before the run counts as a hang (the rank's watcher waits a grace)


@dataclass
class Data:
    root: Path
    raw: dict[str, bytes] = field(default_factory=dict)
    raw_b: dict[str, bytes] = field(default_factory=dict)


def _files(d: Path) -> dict[str, bytes]:
    return {p.relative_to(d).as_posix(): p.read_bytes() for p in d.rglob("*")
            if p.is_file() and ".hpcbench" not in p.relative_to(d).parts}


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Data:
    root = tmp_path_factory.mktemp("faults")
    write_cosmoflow(root / "raw", 12, 4, size=8)
    write_cosmoflow(root / "raw_b", 10, 3, size=8, seed=7)
    for r, out in (("raw", "packed"), ("raw_b", "packed_b")):
        Packer(root / r, root / out, registry.layout("cosmoflow"), 12000, threads=2, progress=False).run()
    return Data(root, _files(root / "raw"), _files(root / "raw_b"))


# ---- helpers that prepare a case ----------------------------------------------------------------
def staged_file(node: Path) -> Path:
    return sorted(p for p in (node / "train").iterdir() if p.is_file())[0]


def _copy(case: Path, d: Data, name: str = "packed") -> Path:
    return Path(shutil.copytree(d.root / name, case / name))


def _shard(src: Path, i: int = 1) -> tuple[Path, object, bytearray]:
    sh = Manifest.load(src / MANIFEST).splits["train"].shards[i]
    return src / sh.name, sh, bytearray((src / sh.name).read_bytes())


def flip_member(case: Path, d: Data) -> None:
    path, sh, data = _shard(_copy(case, d))
    fr = decode_header(data[: sh.header_bytes], sh.name)[1].frames[0]
    data[fr.offset + fr.length // 2] ^= 0x10
    path.write_bytes(bytes(data))


def flip_at(where: Callable[[object, bytearray], int], bit: int = 0x01) -> Callable[[Path, Data], None]:
    def setup(case: Path, d: Data) -> None:
        path, sh, data = _shard(_copy(case, d))
        data[where(sh, data)] ^= bit
        path.write_bytes(bytes(data))
    return setup


def _header_pos(text: bytes) -> Callable[[object, bytearray], int]:
    return lambda sh, data: bytes(data[: sh.header_bytes]).index(text) + 1


def edit_manifest(fn: Callable[[dict], object], reseal: bool = False) -> Callable[[Path, Data], None]:
    def setup(case: Path, d: Data) -> None:
        src = _copy(case, d)
        m = json.loads((src / MANIFEST).read_text())
        m = fn(m)
        if reseal and isinstance(m, dict):
            from hpcbench.staging.manifest import content_hash

            m["sha256"] = content_hash(m)
        (src / MANIFEST).write_text(json.dumps(m))
    return setup


def flip_manifest_byte(frac: float) -> Callable[[Path, Data], None]:
    def setup(case: Path, d: Data) -> None:
        src = _copy(case, d)
        b = bytearray((src / MANIFEST).read_bytes())
        b[int(len(b) * frac)] ^= 0x02
        (src / MANIFEST).write_bytes(bytes(b))
    return setup


def _set_crcs(m: dict) -> dict:
    for s in m["splits"]["train"]["shards"]:
        s["crc32c"] ^= 1
    return m


def truncate(case: Path, d: Data) -> None:
    path, sh, data = _shard(_copy(case, d), 2)
    path.write_bytes(bytes(data[: len(data) - 7]))


def missing_shard(case: Path, d: Data) -> None:
    path, _, _ = _shard(_copy(case, d), 0)
    path.unlink()


def evil_member(name: str) -> Callable[[Path, Data], None]:
    """A consistent (checksummed) packed dataset whose one member has a bad name."""
    def setup(case: Path, d: Data) -> None:
        one_member_pack(case / "packed", name)
    return setup


def stage_first(name: str = "packed", *extra: str, n: int = 4) -> Callable[[Path, Data], None]:
    def setup(case: Path, d: Data) -> None:
        proc = _mpi(n, ["stage", "--source", str(d.root / name), "--dest", f"{case}/st/node{{node}}",
                        "--ranks-per-node", "1", "--timeout", str(TIMEOUT), *extra], None, None)
        assert proc.returncode == 0, proc.stderr
    return setup


def then(*steps: Callable[[Path, Data], None]) -> Callable[[Path, Data], None]:
    def setup(case: Path, d: Data) -> None:
        for s in steps:
            s(case, d)
    return setup


def file_in_the_way(case: Path, d: Data) -> None:
    (case / "st").mkdir()
    (case / "st" / "node1").write_text("not a folder")


def foreign(case: Path, d: Data) -> None:
    (case / "st" / "node2").mkdir(parents=True)
    (case / "st" / "node2" / "notes.txt").write_text("mine")


def break_restage(case: Path, d: Data) -> None:
    """Same dataset (same manifest), one staged file lost and its shard damaged in the source."""
    src = case / "packed"
    staged_file(case / "st" / "node0").unlink()
    for sh in Manifest.load(src / MANIFEST).splits["train"].shards:
        data = bytearray((src / sh.name).read_bytes())
        data[-3] ^= 0x40
        (src / sh.name).write_bytes(bytes(data))


# ---- checks -------------------------------------------------------------------------------------
def verify_success(case: Path, d: Data, raw: dict[str, bytes], replicated: bool = False) -> str | None:
    """Every node: files == marker entries, each byte-identical to the raw source; nodes of one slot
    identical; the slots of a layout together hold the whole dataset, disjoint unless replicated."""
    st = case / "st"
    slots: dict[int, dict[str, bytes]] = {}
    npi = None
    for node in sorted(st.iterdir()):
        try:
            m = check_staged(node)
        except DataError as exc:
            return f"{node.name}: {exc}"
        got = _files(node)
        if set(got) != {e["name"] for e in m["entries"]}:
            return f"{node.name}: files differ from its marker"
        for k, v in got.items():
            if raw.get(k) != v:
                return f"{node.name}: {k} is not byte-identical to the source"
        if list(node.rglob("*.tmp")):
            return f"{node.name}: temporary files left"
        slot, npi = m["layout"]["slot"], m["layout"]["nodes_per_instance"]
        if slots.setdefault(slot, got) != got:
            return f"{node.name}: differs from another node of shard-set {slot}"
    union: dict[str, bytes] = {}
    for got in slots.values():
        if not replicated and set(union) & set(got):
            return "shard-sets overlap"
        union.update(got)
    if union != raw or len(slots) != npi:
        return f"the {len(slots)} shard-sets hold {len(union)} of {len(raw)} files"
    return None


def modes(case: Path, d: Data) -> str | None:
    bad = [p for p in (case / "st").rglob("*") if ".hpcbench" not in p.parts
           and (p.stat().st_mode & 0o777) != (0o750 if p.is_dir() else 0o640)]
    return f"{len(bad)} staged paths ignore umask 027 (e.g. {bad[0]})" if bad else None


def held_lock(case: Path, d: Data) -> None:
    lock = case / "st" / "node1" / ".hpcbench" / "lock"
    lock.parent.mkdir(parents=True)
    fd = os.open(lock, os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)
    os.write(fd, b"pid 1 on test\n")
    _HELD.append(fd)  # released after the case ran


_HELD: list[int] = []
_PROCS: list[subprocess.Popen] = []


def stopped_stager(case: Path, d: Data) -> None:
    """A real first stager on node 1's folder, stopped (SIGSTOP) at its first read, holding the lock."""
    cmd = [mpiexec_path(), "-n", "1", sys.executable, str(Path(__file__).with_name("stage_fault_job.py")),
           "stop:0:0", "stage", "--source", str(d.root / "packed"), "--dest", f"{case}/st/node1", "--timeout", "60"]
    _PROCS.append(subprocess.Popen(cmd, env=project_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                   start_new_session=True))
    lock = case / "st" / "node1" / ".hpcbench" / "lock"
    t0 = time.monotonic()
    while time.monotonic() - t0 < 30:
        if lock.exists() and b"pid" in lock.read_bytes():
            fd = os.open(lock, os.O_RDWR)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                fcntl.flock(fd, fcntl.LOCK_UN)
            except BlockingIOError:
                return
            finally:
                os.close(fd)
        time.sleep(0.05)
    raise RuntimeError("the first stager never took the lock")


def link_victim(case: Path, d: Data) -> None:
    """node0/train replaced by a link to a folder outside dest that holds a copy of the raw files."""
    shutil.copytree(d.root / "raw" / "train", case / "victim")
    shutil.rmtree(case / "st" / "node0" / "train")
    (case / "st" / "node0" / "train").symlink_to(case / "victim")


def victim_intact(case: Path, d: Data) -> str | None:
    got = {p.name: p.read_bytes() for p in (case / "victim").iterdir()}
    want = {k.split("/", 1)[1]: v for k, v in d.raw.items() if k.startswith("train/")}
    return None if got == want else f"the folder outside dest lost {len(set(want) - set(got))} files"


def _journal(case: Path) -> Path:
    return case / "st" / "node0" / ".hpcbench" / "staged.jsonl"


def cut_journal(case: Path, d: Data) -> None:
    j = _journal(case)
    j.write_bytes(j.read_bytes()[:300])


def hand_placed(case: Path, d: Data) -> None:
    (case / "st" / "node2" / "train" / "zz.tfrecord").write_bytes(b"not staged")
    (case / "st" / "node2" / "train" / "notes.txt").write_text("mine")


def lengthen(case: Path, d: Data) -> None:
    path, _, data = _shard(_copy(case, d), 1)
    path.write_bytes(bytes(data) + b"XXXX")


def duplicate_member(case: Path, d: Data) -> None:
    """Shard 1's first member renamed to shard 0's first member; header crc, shard crc and manifest
    sha256 recomputed: a consistent dataset that names one file twice."""
    import crc32c

    from hpcbench.staging.manifest import content_hash

    src = _copy(case, d)
    m = json.loads((src / MANIFEST).read_text())
    shards = m["splits"]["train"]["shards"]
    first = decode_header((src / shards[0]["name"]).read_bytes()[: shards[0]["header_bytes"]], "s0")[0].name
    path = src / shards[1]["name"]
    data = bytearray(path.read_bytes())
    hb = shards[1]["header_bytes"]
    mine = decode_header(data[:hb], "s1")[0].name
    assert len(mine) == len(first)
    hdr = bytes(data[:hb]).replace(mine.encode(), first.encode(), 1)
    data[:hb] = hdr
    path.write_bytes(bytes(data))
    shards[1]["header_crc32c"] = crc32c.crc32c(hdr)
    shards[1]["crc32c"] = crc32c.crc32c(bytes(data))
    m["sha256"] = content_hash(m)
    (src / MANIFEST).write_text(json.dumps(m))
BASE = ["--instances", "2", "--ranks-per-node", "1", "--chunk-mb", "1"]
R2 = ["--instances", "2", "--ranks-per-node", "2"]

CASES: list[Case] = [
    # -- must succeed, byte for byte ------------------------------------------------------------
    Case("ok 4 ranks, 2 instances x 2 nodes", BASE + ["--verify"]),
    Case("ok 4 ranks, 1 instance x 4 nodes", ["--instances", "1", "--ranks-per-node", "1", "--replicate",
                                              "validation"]),
    Case("ok 2 instances in 1 node (-n 4)", ["--instances", "2"]),
    Case("ok 2 instances per node, 2 nodes (-n 8)", ["--instances", "4", "--ranks-per-node", "4"], n=8),
    Case("ok 2 ranks per node, 1 node per instance", R2),
    Case("ok 2 ranks per node, instances span 2 nodes (-n 8)", R2, n=8),
    Case("ok resume (second run skips)", BASE, setup=stage_first("packed", *BASE)),
    Case("ok restage after a lost file", BASE,
         setup=then(stage_first("packed", *BASE), lambda c, d: staged_file(c / "st/node3").unlink())),
    Case("ok --verify repairs a same-size damaged file", BASE + ["--verify"],
         setup=then(stage_first("packed", *BASE),
                    lambda c, d: staged_file(c / "st/node0").write_bytes(b"\0" * staged_file(c / "st/node0").stat().st_size))),
    Case("ok layout change 1 -> 2 nodes per instance drops other files", BASE,
         setup=stage_first("packed", "--instances", "4")),
    Case("ok layout change 2 -> 1 node per instance", ["--instances", "4", "--ranks-per-node", "1"],
         setup=stage_first("packed", *BASE)),
    Case("ok other dataset with --clean", BASE + ["--clean"], source="packed_b", setup=stage_first("packed", *BASE)),
    Case("ok --method copy", BASE + ["--method", "copy", "--dataset", "cosmoflow", "--shard-mb", "0.005"], source="raw"),
    Case("ok --replicate train", BASE + ["--replicate", "train"]),
    Case("ok files follow the umask (027)", BASE, umask=0o027, check=modes),
    # -- corruption: named errors -------------------------------------------------------------------
    Case("bit flip inside a member", BASE, "corrupt shard train/shard-00001.zst: member", setup=flip_member),
    Case("bit flip in a header member name", BASE, "corrupt shard train/shard-00001.zst: its header",
         setup=flip_at(_header_pos(b"univ_"))),
    Case("bit flip in a header offset", BASE, "corrupt shard train/shard-00001.zst: its header",
         setup=flip_at(lambda sh, d: bytes(d[: sh.header_bytes]).index(b'"offset":') + 9)),
    Case("bit flip in the header length field", BASE, "corrupt shard train/shard-00001.zst: its header fails",
         setup=flip_at(lambda sh, d: 9)),
    Case("bit flip in the magic", BASE, "corrupt shard train/shard-00001.zst: its header fails",
         setup=flip_at(lambda sh, d: 2)),
    Case("bit flip in the last byte of a shard", BASE, "corrupt shard train/shard-00001.zst",
         setup=flip_at(lambda sh, d: len(d) - 1)),
    Case("manifest crc32c values wrong", BASE, "corrupt manifest", setup=edit_manifest(_set_crcs)),
    # every shard's crc32c is wrong: the ranks' reports name whichever shards they read before the job ended
    Case("manifest crc32c wrong and resealed", BASE, ".zst: its bytes fail the manifest's crc32c check",
         setup=edit_manifest(_set_crcs, reseal=True)),
    Case("manifest bit flip at 30%", BASE, "manifest.json", setup=flip_manifest_byte(0.3)),
    Case("manifest bit flip at 60%", BASE, "manifest.json", setup=flip_manifest_byte(0.6)),
    Case("manifest bit flip at 90%", BASE, "manifest.json", setup=flip_manifest_byte(0.9)),
    Case("manifest is a JSON list", BASE, "a JSON object was expected", setup=edit_manifest(lambda m: [m])),
    Case("manifest is null", BASE, "found null", setup=edit_manifest(lambda m: None)),
    Case("manifest of format v1", BASE, "repack it",
         setup=edit_manifest(lambda m: {**m, "version": 1})),
    Case("no manifest", BASE, "no packed-dataset manifest", setup=lambda c, d: (c / "packed").mkdir()),
    Case("truncated shard", BASE, "truncated shard train/shard-00002.zst", setup=truncate),
    Case("shard longer than the manifest says", BASE, "bytes too many", setup=lengthen),
    Case("duplicate member across shards (resealed)", BASE,
         "appears in shards train/shard-00000.zst and train/shard-00001.zst", setup=duplicate_member),
    Case("missing shard", BASE, "shard train/shard-00000.zst is missing", setup=missing_shard),
    Case("path traversal member", BASE, "refusing member name '../../escape.tfrecord'",
         setup=evil_member("../../escape.tfrecord")),
    Case("absolute member path", BASE, "refusing member name '/tmp/abs.tfrecord'", setup=evil_member("/tmp/abs.tfrecord")),
    Case("reserved member .hpcbench/staged.jsonl", BASE, "are reserved", setup=evil_member(".hpcbench/staged.jsonl")),
    Case("reserved member .x.tmp", BASE, "are reserved", setup=evil_member("train/.x.tmp")),
    Case("failed restage removes the marker", BASE, "corrupt shard",
         setup=then(lambda c, d: _copy(c, d), lambda c, d: stage_first(str(c / "packed"), *BASE)(c, d), break_restage)),
    # -- destinations ---------------------------------------------------------------------------
    Case("not enough free space", BASE + ["--reserve-mb", "1e12"], "not enough free space"),
    Case("dest == source", ["--dest", "{src}"], "overlap", n=1),
    Case("dest inside source", BASE + ["--dest", "{src}/st{node}"], "overlap"),
    Case("source inside dest", ["--dest", "{case}"], "overlap", n=1, setup=lambda c, d: _copy(c, d)),
    Case("one node's dest blocked by a file", BASE, "node 1:", setup=file_in_the_way),
    Case("other dataset without --clean", BASE, "holds another dataset", source="packed_b",
         setup=stage_first("packed", *BASE)),
    Case("foreign non-empty dest", BASE, "is not empty and was not made by", setup=foreign),
    Case("second stager on the same dest", BASE, "being staged by another", setup=held_lock),
    Case("second stager while a real one is stopped holding the lock", BASE, "being staged by another `hpcbench "
         "stage` (pid", setup=stopped_stager),
    Case("linked folder in dest, layout change", BASE, "is a symbolic link", setup=then(
        stage_first("packed", "--instances", "4"), link_victim), check=victim_intact),
    Case("linked folder in dest, other dataset --clean", BASE + ["--clean"], "is a symbolic link", source="packed_b",
         setup=then(stage_first("packed", "--instances", "4"), link_victim), check=victim_intact),
    Case("ok journal lost, other dataset --clean", BASE + ["--clean"], source="packed_b",
         setup=then(stage_first("packed", *BASE), lambda c, d: _journal(c).unlink())),
    Case("ok journal cut to 300 bytes, other dataset --clean", BASE + ["--clean"], source="packed_b",
         setup=then(stage_first("packed", *BASE), cut_journal)),
    Case("hand-placed files in a staged dest", BASE, "does not list (train/notes.txt, train/zz.tfrecord)",
         setup=then(stage_first("packed", *BASE), hand_placed)),
    Case("ok hand-placed files removed with --clean", BASE + ["--clean"],
         setup=then(stage_first("packed", *BASE), hand_placed)),
    Case("split with fewer shards than an instance's nodes", ["--instances", "1", "--ranks-per-node", "1"],
         "too few for instances of 4 nodes (node"),
    # -- bad input ------------------------------------------------------------------------------
    Case("--dry-run --instances 0", ["--dry-run", "--nodes", "4", "--instances", "0"], "--instances must be >= 1"),
    Case("--dry-run --instances -4", ["--dry-run", "--nodes", "4", "--instances", "-4"], "--instances must be >= 1"),
    Case("--instances 0", ["--instances", "0"], "--instances must be >= 1"),
    Case("--ranks-per-node 0", ["--ranks-per-node", "0"], "--ranks-per-node must be >= 1"),
    Case("--reserve-mb -100", BASE + ["--reserve-mb", "-100"], "--reserve-mb must be a finite number >= 0"),
    Case("--chunk-mb 0", BASE + ["--chunk-mb", "0"], "--chunk-mb must be a finite number > 0"),
    Case("--timeout 0", ["--instances", "2", "--timeout", "0"], "--timeout must be a finite number > 0"),
    Case("--timeout inf", BASE + ["--timeout", "inf"], "--timeout must be a finite number > 0"),
    Case("--reserve-mb nan", BASE + ["--reserve-mb", "nan"], "--reserve-mb must be a finite number"),
    Case("--report is a folder", BASE + ["--report", "{case}"], "is a folder"),
    Case("--chunk-mb nan (usage error)", BASE + ["--chunk-mb", "nan"], "invalid int value: 'nan'"),
    Case("--instances x (usage error)", ["--instances", "x"], "invalid int value: 'x'"),
    Case("unknown split", BASE + ["--splits", "nosuch"], "no split 'nosuch'"),
    Case("wrong --dataset", BASE + ["--dataset", "deepcam"], "packed dataset is 'cosmoflow'"),
    Case("instance sharing a node it spans (-n 6)", ["--instances", "2", "--ranks-per-node", "2"],
         "an instance must hold whole nodes", n=6),
    Case("ok 3 instances x 2 nodes (-n 6)", ["--instances", "3", "--ranks-per-node", "1"], n=6),
    # -- dead, hung and stopped ranks -----------------------------------------------------------
    Case("a stager dies mid-transfer", BASE, "injected fault", fault="exit:1:0", once=False),
    Case("a stager hangs mid-transfer", BASE, "every rank answered: one is alive but its work is stuck",
         fault="hang:1:0"),
    Case("a stager is stopped (SIGSTOP)", BASE, "rank 2 did not answer", fault="stop:2:0"),
    Case("a non-stager is stopped while waiting", R2, "rank 1 did not answer", fault="stop-wait:1:2",
         marker_ok=True),  # the stagers finished: their nodes are completely staged
    Case("rank 0 is stopped reading the manifest", R2, "rank 0 did not answer", fault="stop-wait:0:1"),
    Case("a non-stager dies while waiting", R2, "injected fault", fault="exit-wait:3:2", once=False),
    Case("a rank is stopped before the manifest's bcast", R2, "no progress for 3s while receiving the manifest",
         fault="stop-deadline:0:1"),
    Case("a stager is stopped before the reports' gather", R2, "no progress for 3s while gathering",
         fault="stop-deadline:2:3", marker_ok=True),
    Case("a rank is stopped after the report", R2, "no progress for 3s while exiting (waiting for every rank to "
         "finish); rank 3 did not arrive", fault="stop-exit:3:0", marker_ok=True),
    Case("rank 0 is stopped after the report", BASE, "rank 0 did not confirm that every rank arrived",
         fault="stop-exit:0:0", marker_ok=True, grace=5),  # the others wait 5 s longer for rank 0
    # the windows no peer can see: the rank's watcher (hpcbench.staging.guard) names it and kills it
    Case("a rank is stopped just past the last barrier", BASE, "rank 2 (pid", fault="stop-final:2:0",
         marker_ok=True, grace=STOP_GRACE_S),
    Case("a rank is stopped after MPI_Finalize", BASE, "rank 3 (pid", fault="stop-gone:3:0", marker_ok=True,
         grace=STOP_GRACE_S),
    Case("rank 0 is stopped after MPI_Finalize", R2, "rank 0 (pid", fault="stop-gone:0:0", marker_ok=True,
         grace=STOP_GRACE_S),
    Case("a rank is stopped before MPI_Init", BASE, "rank 1 (pid", fault="stop-init:1:0", grace=STOP_GRACE_S),
    Case("--timeout 1e10", BASE + ["--timeout", "1e10"], "--timeout must be between 1 and 604800 seconds"),
    Case("--timeout 1e-9", BASE + ["--timeout", "1e-9"], "--timeout must be between 1 and 604800 seconds"),
]



# -- messages (staging issue, item 5): each names what is wrong and what to do ----------------------
def reseal_header(edit: Callable[[bytes], bytes], i: int = 1) -> Callable[[Path, Data], None]:
    """Shard i's header edited (same length) and every checksum recomputed (header crc, shard crc,
    manifest sha256): only the header's own checks can find it."""
    def setup(case: Path, d: Data) -> None:
        import crc32c

        from hpcbench.staging.manifest import content_hash

        src = _copy(case, d)
        m = json.loads((src / MANIFEST).read_text())
        sh = m["splits"]["train"]["shards"][i]
        path = src / sh["name"]
        data = bytearray(path.read_bytes())
        hdr = edit(bytes(data[: sh["header_bytes"]]))
        assert len(hdr) == sh["header_bytes"]
        data[: sh["header_bytes"]] = hdr
        path.write_bytes(bytes(data))
        sh["header_crc32c"], sh["crc32c"] = crc32c.crc32c(hdr), crc32c.crc32c(bytes(data))
        m["sha256"] = content_hash(m)
        (src / MANIFEST).write_text(json.dumps(m))
    return setup


def _more_files(m: dict) -> dict:
    m["splits"]["train"]["files"] += 1
    return m


def _shard_more_files(m: dict) -> dict:
    m["splits"]["train"]["shards"][1]["files"] += 1
    m["splits"]["train"]["files"] += 1
    return m


CASES += [
    Case("member named train/./x (not a normal path)", BASE, "refusing member name 'train/./x.tfrecord': not a "
         "normal relative path", setup=evil_member("train/./x.tfrecord")),
    Case("header key renamed (resealed)", BASE,
         "corrupt shard train/shard-00001.zst: header member 0 ('train/univ_",
         setup=reseal_header(lambda h: h.replace(b'"raw_offset"', b'"raw_offzet"', 1))),
    Case("split file count edited (resealed)", BASE, "split 'train' lists 13 files but its",
         setup=edit_manifest(_more_files, reseal=True)),
    Case("shard file count edited with its split's (resealed)", BASE,
         "shard train/shard-00001.zst's header lists", setup=edit_manifest(_shard_more_files, reseal=True)),
    Case("--method copy, too few shards: stage --shard-mb", ["--instances", "1", "--ranks-per-node", "1", "--method",
                                                             "copy", "--dataset", "cosmoflow"],
         "stage it with a smaller `hpcbench stage --shard-mb`", source="raw"),
    Case("--threads 100000", BASE + ["--threads", "100000"], "--threads must be from 1 to 1024"),
    Case("--chunk-mb 4096", BASE[:-2] + ["--chunk-mb", "4096"], "--chunk-mb must be from 1 to 2047"),
    Case("--shard-mb 1e-9", BASE + ["--shard-mb", "1e-9"], "--shard-mb must be a finite number of MiB > 0"),
]

TAG_VAR = "HPCBENCH_FAULT_TAG"
LEFT_S = 10  # after mpiexec returned, its ranks and their watchers must be gone within this


def tagged(tag: str) -> list[int]:
    """Live processes started with ``TAG_VAR=tag`` in their environment (mpiexec, its proxy, the ranks,
    their watchers: the launcher puts each rank in a session of its own, so no process group holds them)."""
    want = f"{TAG_VAR}={tag}".encode()
    pids = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/environ", "rb") as f:
                    if want not in f.read().split(b"\0"):
                        continue
                with open(f"/proc/{d}/stat", "rb") as f:
                    if f.read().rsplit(b")", 1)[1].split()[0] != b"Z":
                        pids.append(int(d))
            except (OSError, IndexError):
                continue
    return pids


def reap(tag: str, wait_s: float) -> list[int]:
    """Wait up to ``wait_s`` for the tagged processes to end; kill (SIGCONT + SIGKILL) and return those left."""
    t0 = time.monotonic()
    while (left := tagged(tag)) and time.monotonic() - t0 < wait_s:
        time.sleep(0.2)
    for pid in left:
        for sig in (signal.SIGCONT, signal.SIGKILL):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
    return left


def _mpi(n: int, args: list[str], fault: str | None, umask: int | None) -> subprocess.CompletedProcess[str]:
    entry = [str(Path(__file__).with_name("stage_fault_job.py")), fault] if fault else ["-m", "hpcbench"]
    cmd = [mpiexec_path(), "-n", str(n), sys.executable, *entry, *args]
    pre = (lambda: os.umask(umask)) if umask is not None else None
    tag = uuid.uuid4().hex
    proc = subprocess.Popen(cmd, env=project_env(**{TAG_VAR: tag}), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True, preexec_fn=pre)
    try:
        out, err = proc.communicate(timeout=HANG_S)
        rc = proc.returncode
    except subprocess.TimeoutExpired:
        reap(tag, 0)
        out, err = proc.communicate()
        rc = -999
    finally:
        left = reap(tag, LEFT_S)
    if left:
        err += f"\n[test] {len(left)} processes of the job were left behind {LEFT_S}s after it ended (killed)\n"
    return subprocess.CompletedProcess(cmd, rc, out, err)


def run_case(case: Case, d: Data, folder: Path) -> dict[str, object]:
    folder.mkdir(parents=True)
    if case.setup:
        try:
            case.setup(folder, d)
        except Exception as exc:  # noqa: BLE001 - a broken case is reported with the others
            return {"case": case.name, "rc": None, "took": 0.0, "hang": False, "traceback": False, "wrong": False,
                    "problem": f"setup failed: {exc!r}"}
    src = folder / case.source if (folder / case.source).exists() else d.root / case.source
    args = ["stage"]
    if "--dry-run" not in case.args:
        args += ["--source", str(src)]
        if "--dest" not in case.args:
            args += ["--dest", f"{folder}/st/node{{node}}"]
    args += [a.replace("{src}", str(src)).replace("{case}", str(folder)) for a in case.args]
    timeout = 0
    if "--timeout" not in case.args:
        timeout = QUIET_TIMEOUT if case.expect is None else TIMEOUT
        args += ["--timeout", str(timeout)]
    t0 = time.monotonic()
    proc = _mpi(case.n, args, case.fault, case.umask)
    took = time.monotonic() - t0
    out = proc.stdout + proc.stderr
    res: dict[str, object] = {"case": case.name, "rc": proc.returncode, "took": round(took, 1),
                              # a failing run must end within its watchdog's time; a run that succeeds
                              # slowly on a loaded machine is slow, not hung (its output is checked below)
                              "hang": proc.returncode == -999 or (proc.returncode != 0
                                                                  and took > timeout + GRACE_S + case.grace),
                              "traceback": "Traceback" in out, "wrong": False, "problem": None}
    if "processes of the job were left behind" in out:
        res["problem"] = out[out.index("[test]"):].strip()
    elif case.expect is None:
        if proc.returncode != 0:
            res["problem"] = f"exit {proc.returncode}: {out[-600:]}"
        else:
            raw = d.raw_b if case.source == "packed_b" else d.raw
            bad = verify_success(folder, d, raw, replicated="--replicate" in case.args)
            bad = bad or (case.check(folder, d) if case.check else None)
            if bad:
                res["wrong"], res["problem"] = True, bad
    else:
        if proc.returncode == 0:
            res["wrong"], res["problem"] = True, "exit 0 where an error was expected"
        elif case.expect not in out:
            res["problem"] = f"expected {case.expect!r} in: {out[-600:]}"
        elif out.count("hpcbench stage: error:") > 1 or (case.once and out.count("hpcbench stage: error:") != 1):
            res["problem"] = f"error printed {out.count('hpcbench stage: error:')} times: {out[-600:]}"
        st = folder / "st"
        if st.is_dir():
            done = [p for p in st.glob("*/" + str(MARKER))]
            if done and not case.marker_ok:
                res["wrong"], res["problem"] = True, f"completion marker left after a failure: {done[0]}"
            # a rank that dies takes the job down by SIGKILL: its hidden temporaries (no loader reads
            # them; the next run sweeps them) may remain; every abort this code makes removes them
            if list(st.rglob(".*.tmp")) and case.once:
                res["problem"] = "temporary files left after a failure"
        if case.check and not res["problem"]:
            res["problem"] = case.check(folder, d)
    return res


@pytest.mark.slow
def test_fault_matrix(data: Data, tmp_path: Path) -> None:
    """All cases; ``STAGE_FAULT_CASES=stopped,--timeout`` runs those whose names hold one of the words."""
    assert len(CASES) >= 40
    words = [w for w in os.environ.get("STAGE_FAULT_CASES", "").split(",") if w]
    cases = [c for c in CASES if not words or any(w in c.name for w in words)]
    # longest first (a stopped or hanging rank waits out --timeout: 5-12 s; the rest take 1-2 s), so that the
    # workers finish together; three workers: the cases use about one core of two (measured: 105 s of CPU
    # in 100 s with two workers)
    order = sorted(enumerate(cases), key=lambda ic: not any(w in ic[1].name for w in ("stopped", "hangs")))
    try:
        with ThreadPoolExecutor(3) as pool:
            results = list(pool.map(lambda ic: run_case(ic[1], data, tmp_path / f"c{ic[0]:02d}"), order))
    finally:
        for fd in _HELD:
            os.close(fd)
        for p in _PROCS:
            os.killpg(p.pid, signal.SIGCONT)
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    wrong = sum(bool(r["wrong"]) for r in results)
    hangs = sum(bool(r["hang"]) for r in results)
    tracebacks = sum(bool(r["traceback"]) for r in results)
    failed = [r for r in results if r["problem"] or r["hang"] or r["traceback"]]
    print(f"\nstaging fault matrix: {len(results)} cases, {wrong} silent wrong results, {hangs} hangs past the "
          f"timeout, {tracebacks} tracebacks, {len(failed)} failed cases")
    for r in results:
        print(f"  {'FAIL' if r in failed else 'ok  '} {r['took']:>5}s rc={str(r['rc']):<4} {r['case']}"
              + (f": {r['problem']}" if r["problem"] else ""))
    assert not failed, "\n".join(f"{r['case']}: {r['problem'] or ('hang' if r['hang'] else 'traceback')}"
                                 for r in failed)


def test_marker_check_refuses_unlisted_files(tmp_path: Path) -> None:
    """Training side: a completely staged folder with one more sample file in a split folder (placed
    by hand, or left by a staging whose journal was lost) is refused, naming the file."""
    import crc32c

    from hpcbench.staging.marker import NodeLayout, write_marker

    (tmp_path / "train").mkdir()
    (tmp_path / "train" / "a.tfrecord").write_bytes(b"abc")
    write_marker(tmp_path, "cosmoflow", "0" * 64, NodeLayout(0, 0, 1, 1, 1), ["train"],
                 [["train/a.tfrecord", 3, crc32c.crc32c(b"abc")]])
    check_staged(tmp_path, "cosmoflow")
    (tmp_path / "train" / ".hidden.tmp").write_bytes(b"x")  # hidden: no loader reads it
    check_staged(tmp_path, "cosmoflow")
    (tmp_path / "train" / "b.tfrecord").write_bytes(b"stale")
    with pytest.raises(DataError, match=r"not in the completion marker \(train/b.tfrecord\)"):
        check_staged(tmp_path, "cosmoflow")


def _rank_pids(tag: str) -> dict[int, int]:
    """World rank -> pid of the job's rank processes (their watchers inherit the environment, PMI_RANK
    included: they are told apart by their command line)."""
    out = {}
    for pid in tagged(tag):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = dict(kv.split(b"=", 1) for kv in f.read().split(b"\0") if b"=" in kv)
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read()
        except OSError:
            continue
        if b"PMI_RANK" in env and b"guard.py" not in cmd:
            out[int(env[b"PMI_RANK"])] = pid
    return out


def _has_guard(tag: str, pid: int) -> bool:
    for p in tagged(tag):
        try:
            with open(f"/proc/{p}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if any(a.endswith(b"guard.py") for a in argv) and str(pid).encode() in argv:
            return True
    return False


@pytest.mark.parametrize("when", ["report", "init"])
def test_external_sigstop_ends_the_job(data: Data, tmp_path: Path, when: str) -> None:
    """The issue's reproduction: a real `hpcbench stage` (no injected fault), one rank stopped from
    outside with SIGSTOP when "staging report" appears (or, for MPI_Init, as soon as its watcher runs,
    before MPI is up). The job must end within a real bound (--timeout 10: under 60 s), leave no
    process behind, and, when it fails, name the stopped rank. A stop at the report may land after
    that rank already exited (then the job succeeds)."""
    import select

    tag = uuid.uuid4().hex
    victim = 3 if when == "report" else 1
    cmd = [mpiexec_path(), "-n", "4", sys.executable, "-m", "hpcbench", "stage", "--source", str(data.root / "packed"),
           "--dest", f"{tmp_path}/st/node{{node}}", *BASE, "--timeout", "10"]
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, env=project_env(**{TAG_VAR: tag}), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True)
    out, stopped, pids, scanned = b"", None, {}, 0.0
    try:
        assert proc.stdout is not None
        while time.monotonic() - t0 < 90:
            if stopped is None and time.monotonic() - scanned > 0.05:  # /proc scans cost CPU: not too often
                pids, scanned = _rank_pids(tag), time.monotonic()
            if stopped is None and victim in pids and (
                    (when == "report" and b"staging report" in out) or (when == "init" and _has_guard(tag, pids[victim]))):
                os.kill(pids[victim], signal.SIGSTOP)
                stopped = time.monotonic() - t0
            ready, _, _ = select.select([proc.stdout], [], [], 0.005)
            if ready:
                chunk = os.read(proc.stdout.fileno(), 65536)
                if not chunk:
                    break
                out += chunk
        proc.wait(timeout=max(1.0, 90 - (time.monotonic() - t0)))
        took = time.monotonic() - t0
    finally:
        left = reap(tag, LEFT_S)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = out.decode(errors="replace")
    print(f"\nstopped rank {victim} at {stopped}s; rc {proc.returncode} after {took:.1f}s")
    assert stopped is not None, f"rank {victim} was never stopped: {text[-800:]}"
    assert not left, f"{len(left)} processes left behind: {text[-800:]}"
    assert took - stopped < 50, f"the job ended {took - stopped:.0f}s after the stop: {text[-800:]}"
    if when == "init" or proc.returncode != 0:
        assert proc.returncode != 0, text[-800:]
        # "rank 3 did not answer ..." or, when a peer waiting on it is late too, "ranks 1, 3 did not arrive"
        assert re.search(rf"\branks? (?:\d+, )*{victim}\b", text) and "Traceback" not in text, text[-800:]
