"""The packed format: shard files with an index header, and the dataset manifest.

A shard is ``MAGIC | u32 header length | header JSON | zstd frames``. The header lists the shard's
files; each file is one or more independently compressed frames (big files such as an LMDB are cut
into ``chunk_bytes`` pieces, so they decompress in parallel and reassemble on the node). Every frame
carries the crc32c of its raw bytes; every file the crc32c of its whole content.

``manifest.json`` (one per packed dataset) lists per split the shards with their sizes, file and
sample counts, the crc32c of each shard file and of its header. The per-file listing lives in the shard
headers (and in ``listing.tsv`` for people and tools), so the manifest stays small at 500k files.

Integrity chain (format v2): the manifest carries the sha256 of its own canonical content (checked on
every load; the same hash names the dataset in a node's completion marker), the manifest holds each
shard header's crc32c (checked before the header is decoded) and each shard's crc32c (checked over the
received bytes before any member is renamed into place), the header holds each frame's and each
member's crc32c (checked after decompression). One flipped bit anywhere fails with the shard's name.
Format v1 (no manifest or header checksums) is refused with a "repack" message.
"""
from __future__ import annotations

import hashlib
import json
import struct
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path, PurePosixPath
from typing import Any

import crc32c

from hpcbench.common.errors import DataError

MAGIC = b"HPCBSHD1"
FORMAT = "hpcbench-packed"
VERSION = 2
MANIFEST = "manifest.json"
#: the node-local state folder of staging: no dataset member may live below it
STATE_DIR = ".hpcbench"
_HDR = struct.Struct("<8sI")


@dataclass
class Frame:
    offset: int  # in the shard file
    length: int  # compressed bytes
    raw_offset: int  # in the original file
    raw_length: int
    crc32c: int  # of the raw bytes


@dataclass
class FileEntry:
    name: str  # relative POSIX path in the dataset
    size: int
    crc32c: int
    frames: list[Frame]

    @property
    def end(self) -> int:
        """Shard offset just past this file's last frame."""
        return max(f.offset + f.length for f in self.frames) if self.frames else 0


@dataclass
class ShardInfo:
    name: str  # file name inside the packed folder, e.g. train/shard-00003.zst
    bytes: int
    raw_bytes: int
    files: int
    header_bytes: int
    crc32c: int  # of the whole shard file
    header_crc32c: int = 0  # of the first header_bytes bytes


@dataclass
class SplitInfo:
    replicate: bool
    shards: list[ShardInfo] = field(default_factory=list)

    @property
    def files(self) -> int:
        return sum(s.files for s in self.shards)

    @property
    def raw_bytes(self) -> int:
        return sum(s.raw_bytes for s in self.shards)

    @property
    def bytes(self) -> int:
        return sum(s.bytes for s in self.shards)


@dataclass
class Manifest:
    dataset: str
    splits: dict[str, SplitInfo]
    chunk_bytes: int
    level: int = 3
    source: str = ""

    def to_json(self) -> str:
        d: dict[str, Any] = {"format": FORMAT, "version": VERSION, "dataset": self.dataset,
                             "chunk_bytes": self.chunk_bytes, "level": self.level, "source": self.source,
                             "splits": {}}
        for name, sp in self.splits.items():
            d["splits"][name] = {"replicate": sp.replicate, "files": sp.files, "raw_bytes": sp.raw_bytes,
                                 "bytes": sp.bytes, "shards": [asdict(s) for s in sp.shards]}
        d["sha256"] = content_hash(d)
        return json.dumps(d, indent=1) + "\n"

    @property
    def sha256(self) -> str:
        """The hash that names this exact dataset (the one stored in the manifest)."""
        return content_hash(json.loads(self.to_json()))

    @classmethod
    def load(cls, path: Path) -> "Manifest":
        try:
            d = json.loads(path.read_text())
        except FileNotFoundError:
            raise DataError(f"{path}: no packed-dataset manifest here; run `hpcbench pack` first") from None
        except (OSError, ValueError) as exc:
            raise DataError(f"{path}: unreadable manifest ({exc})") from None
        if not isinstance(d, dict):
            raise DataError(f"{path}: not a {FORMAT} manifest (a JSON object was expected, found "
                            f"{type(d).__name__ if d is not None else 'null'})")
        if d.get("format") == FORMAT and d.get("version") == 1:
            raise DataError(f"{path}: packed with format v1, which has no manifest or shard-header checksums; "
                            f"repack it with `hpcbench pack` (this version reads v{VERSION} only)")
        if d.get("format") != FORMAT or d.get("version") != VERSION:
            raise DataError(f"{path}: not a {FORMAT} v{VERSION} manifest "
                            f"(format={d.get('format')!r}, version={d.get('version')!r})")
        if d.get("sha256") != content_hash(d):
            raise DataError(f"{path}: corrupt manifest: its content does not match its sha256 "
                            "(a changed byte, or edited by hand); repack or restore it")
        try:
            splits = {n: _split(n, s) for n, s in d["splits"].items()}
            return cls(d["dataset"], splits, d["chunk_bytes"], d.get("level", 3), d.get("source", ""))
        except DataError as exc:
            raise DataError(f"{path}: malformed manifest: {exc}") from None
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise DataError(f"{path}: malformed manifest ({exc!r})") from None


def content_hash(d: dict[str, Any]) -> str:
    """sha256 of a manifest's canonical JSON, its own ``sha256`` key left out."""
    body = {k: v for k, v in d.items() if k != "sha256"}
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def _bool(x: Any) -> bool:
    if not isinstance(x, bool):
        raise DataError(f"'replicate' must be true or false, got {x!r}")
    return x


def _split(name: str, s: Any) -> SplitInfo:
    """One split of the manifest; its recorded totals must be the sums over its shards."""
    if not isinstance(s, dict) or not isinstance(s.get("shards"), list):
        raise DataError(f"split {name!r} has no 'shards' list")
    info = SplitInfo(_bool(s.get("replicate")), [_shard(x, f"split {name!r} shard {i}")
                                                 for i, x in enumerate(s["shards"])])
    for key in ("files", "raw_bytes", "bytes"):
        if key not in s:
            raise DataError(f"split {name!r} has no key {key!r}")
        if s[key] != getattr(info, key):
            raise DataError(f"split {name!r} lists {s[key]!r} {key.replace('_', ' ')} but its {len(info.shards)} "
                            f"shards hold {getattr(info, key)} (a hand edit, or a manifest stitched from two packs): "
                            "repack it with `hpcbench pack`")
    return info


def _shard(x: Any, what: str) -> ShardInfo:
    s = ShardInfo(**_fields(ShardInfo, x, what))
    safe_relpath(s.name, "manifest")
    return s


def safe_relpath(name: str, where: str) -> PurePosixPath:
    """A member name as a relative path; absolute paths and ``..`` are refused (path traversal)."""
    if not isinstance(name, str):
        raise DataError(f"{where}: member name {name!r} is not a string")
    p = PurePosixPath(name)
    if not name or p.is_absolute() or ".." in p.parts or "\\" in name or "\x00" in name:
        raise DataError(f"{where}: refusing member name {name!r}: absolute paths and '..' are not allowed")
    if any(part in ("", ".") for part in name.split("/")):  # 'train/./x', 'train//x', 'train/': not one spelling
        normal = "/".join(part for part in name.split("/") if part not in ("", "."))
        raise DataError(f"{where}: refusing member name {name!r}: not a normal relative path (an empty or '.' "
                        f"part; {f'write {normal!r}' if normal else 'it names no file'}): one file must have one name")
    if p.parts[0] == STATE_DIR or (p.name.startswith(".") and p.name.endswith(".tmp")):
        raise DataError(f"{where}: refusing member name {name!r}: {STATE_DIR}/ and '.*.tmp' names are reserved "
                        "for staging's own state and temporary files")
    return p


def refuse_overlap(source: Path, dest: Path) -> None:
    """Source and destination must be disjoint folders (resolved, both directions): writing into the
    source would destroy it, and a source inside the destination would be cleaned or overwritten."""
    a, b = source.resolve(), dest.resolve()
    if a == b or b.is_relative_to(a) or a.is_relative_to(b):
        raise DataError(f"--dest {dest} and --source {source} overlap: the destination must not be inside the "
                        f"source, nor the source inside the destination (resolved: {b} and {a})")


def encode_header(shard: str, files: list[FileEntry]) -> bytes:
    body = json.dumps({"shard": shard, "files": [asdict(f) for f in files]}, separators=(",", ":")).encode()
    return _HDR.pack(MAGIC, len(body)) + body


def header_size(first_bytes: bytes, where: str) -> int:
    if len(first_bytes) < _HDR.size:
        raise DataError(f"{where}: truncated shard header ({len(first_bytes)} bytes)")
    magic, n = _HDR.unpack_from(first_bytes)
    if magic != MAGIC:
        raise DataError(f"{where}: not an hpcbench shard (bad magic {magic!r})")
    return _HDR.size + n


def decode_header(data: bytes | memoryview, where: str, crc: int | None = None) -> list[FileEntry]:
    """The header's file list; with ``crc`` (the manifest's header_crc32c) the bytes are checked first."""
    if crc is not None and crc32c.crc32c(data) != crc:
        raise DataError(f"corrupt {where}: its header fails the manifest's crc32c check "
                        "(a changed byte in the member names or offsets)")
    n = header_size(bytes(data[: _HDR.size]), where)
    if len(data) < n:
        raise DataError(f"{where}: truncated shard header (need {n} bytes, have {len(data)})")
    try:
        d = json.loads(bytes(data[_HDR.size: n]))
    except ValueError as exc:
        raise DataError(f"{where}: corrupt shard header (not JSON: {exc})") from None
    if not isinstance(d, dict) or not isinstance(d.get("files"), list):
        raise DataError(f"corrupt {where}: its header has no 'files' list")
    files = [_entry(f, i, where) for i, f in enumerate(d["files"])]
    for f in files:
        safe_relpath(f.name, where)
        if sum(fr.raw_length for fr in f.frames) != f.size:
            raise DataError(f"corrupt {where}: member {f.name}: frames do not add up to its size")
    return files


def _fields(cls: type, d: Any, what: str) -> dict[str, Any]:
    """``d``'s values for dataclass ``cls``: exactly its keys, integers >= 0 but for ``name`` (a string).
    A renamed, missing or extra key or a wrong type is a :class:`DataError` naming ``what`` and the key."""
    names = [f.name for f in fields(cls)]
    if not isinstance(d, dict):
        raise DataError(f"{what} is not a JSON object ({type(d).__name__})")
    required = [k for k in names if k not in d and not (cls is ShardInfo and k == "header_crc32c")]
    if required:
        raise DataError(f"{what} has no key {required[0]!r}")
    extra = [k for k in d if k not in names]
    if extra:
        raise DataError(f"{what} has an unknown key {extra[0]!r} (expected {', '.join(names)})")
    for k, v in d.items():
        if k == "name":
            if not isinstance(v, str):
                raise DataError(f"{what}: key 'name' must be a string, got {v!r}")
        elif k != "frames" and (not isinstance(v, int) or isinstance(v, bool) or v < 0):
            raise DataError(f"{what}: key {k!r} must be an integer >= 0, got {v!r}")
    return d


def _entry(f: Any, i: int, where: str) -> FileEntry:
    what = f"corrupt {where}: header member {i}" + (f" ({f['name']!r})" if isinstance(f, dict)
                                                    and isinstance(f.get("name"), str) else "")
    d = _fields(FileEntry, f, what)
    if not isinstance(d["frames"], list):
        raise DataError(f"{what}: key 'frames' must be a list, got {d['frames']!r}")
    frames = [Frame(**_fields(Frame, fr, f"{what} frame {j}")) for j, fr in enumerate(d["frames"])]
    return FileEntry(d["name"], d["size"], d["crc32c"], frames)


def file_crc(path: Path) -> int:
    """crc32c of a whole file, read in 8 MiB chunks (the checksum the manifest records per member)."""
    crc = 0
    with open(path, "rb", buffering=0) as fh:
        while chunk := fh.read(8 << 20):
            crc = crc32c.crc32c(chunk, crc)
    return crc


def member_index(source: Path, shards: list[ShardInfo], threads: int = 8) -> dict[str, list[str]]:
    """Member names of every shard, from its header (checked against the manifest's header crc32c),
    read before any work: staging must know every file it will write (to refuse or remove anything
    else in the split folders) and a dataset naming one file twice (in one shard or in two) is
    refused naming both shards. A missing or cut-off shard is left to the transfer's own check."""
    from concurrent.futures import ThreadPoolExecutor

    def names(s: ShardInfo) -> list[str] | None:
        try:
            with open(source / s.name, "rb") as fh:
                data = fh.read(s.header_bytes)
        except FileNotFoundError:
            raise DataError(f"shard {s.name} is missing from {source}") from None
        except OSError as exc:
            raise DataError(f"shard {s.name}: cannot read its header in {source}: {exc}") from None
        if len(data) < s.header_bytes:
            return None  # truncated: the transfer's preflight names it with the sizes
        files = decode_header(data, f"shard {s.name}", crc=s.header_crc32c)
        if len(files) != s.files:
            raise DataError(f"corrupt packed dataset {source}: shard {s.name}'s header lists {len(files)} members, "
                            f"the manifest says {s.files}: repack it with `hpcbench pack`")
        return [f.name for f in files]

    with ThreadPoolExecutor(max(1, threads)) as pool:
        got = list(pool.map(names, shards))
    out: dict[str, list[str]] = {}
    owner: dict[str, str] = {}
    for s, ns in zip(shards, got):
        for n in ns or []:
            if n in owner:
                other = owner[n]
                where = f"twice in shard {s.name}" if other == s.name else f"in shards {other} and {s.name}"
                raise DataError(f"corrupt packed dataset {source}: member {n!r} appears {where}; "
                                "one name must be one file: repack it with `hpcbench pack`")
            owner[n] = s.name
        out[s.name] = ns or []
    return out
