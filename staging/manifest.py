"""The packed format: shard files with an index header, and the dataset manifest.

A shard is ``MAGIC | u32 header length | header JSON | zstd frames``. The header lists the shard's
files; each file is one or more independently compressed frames (big files such as an LMDB are cut
into ``chunk_bytes`` pieces, so they decompress in parallel and reassemble on the node). Every frame
carries the crc32c of its raw bytes; every file the crc32c of its whole content.

``manifest.json`` (one per packed dataset) lists per split the shards with their sizes, file and
sample counts and the crc32c of each shard file. The per-file listing lives in the shard headers
(and in ``listing.tsv`` for people and tools), so the manifest stays small at 500k files.
"""
from __future__ import annotations

import json
import struct
from dataclasses import asdict, dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

import crc32c

from common.errors import DataError

MAGIC = b"HPCBSHD1"
FORMAT = "hpcbench-packed"
VERSION = 1
MANIFEST = "manifest.json"
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
    crc32c: int


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
        return json.dumps(d, indent=1) + "\n"

    @classmethod
    def load(cls, path: Path) -> "Manifest":
        try:
            d = json.loads(path.read_text())
        except FileNotFoundError:
            raise DataError(f"{path}: no packed-dataset manifest here; run `hpcbench pack` first") from None
        except (OSError, ValueError) as exc:
            raise DataError(f"{path}: unreadable manifest ({exc})") from None
        if d.get("format") != FORMAT or d.get("version") != VERSION:
            raise DataError(f"{path}: not a {FORMAT} v{VERSION} manifest "
                            f"(format={d.get('format')!r}, version={d.get('version')!r})")
        try:
            splits = {n: SplitInfo(s["replicate"], [ShardInfo(**x) for x in s["shards"]])
                      for n, s in d["splits"].items()}
            return cls(d["dataset"], splits, d["chunk_bytes"], d.get("level", 3), d.get("source", ""))
        except (KeyError, TypeError) as exc:
            raise DataError(f"{path}: malformed manifest ({exc!r})") from None


def safe_relpath(name: str, where: str) -> PurePosixPath:
    """A member name as a relative path; absolute paths and ``..`` are refused (path traversal)."""
    p = PurePosixPath(name)
    if not name or p.is_absolute() or ".." in p.parts or "\\" in name or "\x00" in name:
        raise DataError(f"{where}: refusing member name {name!r}: absolute paths and '..' are not allowed")
    return p


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


def decode_header(data: bytes | memoryview, where: str) -> list[FileEntry]:
    n = header_size(bytes(data[: _HDR.size]), where)
    if len(data) < n:
        raise DataError(f"{where}: truncated shard header (need {n} bytes, have {len(data)})")
    try:
        d = json.loads(bytes(data[_HDR.size: n]))
        files = [FileEntry(f["name"], f["size"], f["crc32c"], [Frame(**fr) for fr in f["frames"]])
                 for f in d["files"]]
    except (ValueError, KeyError, TypeError) as exc:
        raise DataError(f"{where}: corrupt shard header ({exc!r})") from None
    for f in files:
        safe_relpath(f.name, where)
    return files


def file_crc(path: Path) -> int:
    """crc32c of a whole file, read in 8 MiB chunks (the checksum the manifest records per member)."""
    crc = 0
    with open(path, "rb", buffering=0) as fh:
        while chunk := fh.read(8 << 20):
            crc = crc32c.crc32c(chunk, crc)
    return crc
