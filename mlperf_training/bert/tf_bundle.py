"""A TF v1 checkpoint (tensor bundle) read without TensorFlow: ``PREFIX.index`` + ``PREFIX.data-K-of-N``.

The published formats (tensorflow ``core/util/tensor_bundle/tensor_bundle.{h,cc,proto}`` and LevelDB's
``table_format.md``, which TF's ``core/lib/io/table`` follows):

* ``.index`` is an SSTable: data blocks, a metaindex block, an index block, then a 48-byte footer (the
  metaindex and index ``BlockHandle``s as varint64 offset + size, zero padding to 40 bytes, the magic
  ``0xdb4775248b80fb57`` as fixed64 little-endian). Each block is followed by a 1-byte compression type (0:
  none; TF writes bundles uncompressed) and the masked crc32c (fixed32) of the block and that byte. A block
  holds prefix-compressed entries (varint32 shared, non-shared, value length; the key's new bytes; the
  value) then its restart offsets (fixed32 each) and their count (fixed32). The index block maps each data
  block's last key to its ``BlockHandle``.
* The entry of the empty key is a ``BundleHeaderProto`` (1: num_shards, 2: endianness, 0 = little); every
  other key is a tensor name whose value is a ``BundleEntryProto`` (1: dtype, 2: shape as
  ``TensorShapeProto`` (2: dim {1: size}), 3: shard_id, 4: offset, 5: size, 6: crc32c as fixed32, the masked
  crc32c of the tensor's bytes in the data file).

Masking is LevelDB's: ``((crc >> 15) | (crc << 17)) + 0xa282ead8`` (mod 2^32). Every failure is a
:class:`~hpcbench.common.errors.DataError` naming the file and what was expected.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

import crc32c as _crc32c
import numpy as np

from hpcbench.common.errors import DataError

MAGIC = 0xDB4775248B80FB57
FOOTER = 48
_MASK_DELTA = 0xA282EAD8
#: TF DataType enum values -> numpy dtypes (DT_BFLOAT16 is widened to float32 by :func:`_tensor`)
DTYPES = {1: np.float32, 2: np.float64, 3: np.int32, 4: np.uint8, 6: np.int8, 9: np.int64, 10: np.bool_,
          14: np.uint16, 19: np.float16}
DT_BFLOAT16 = 14


def mask(crc: int) -> int:
    return ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + _MASK_DELTA) & 0xFFFFFFFF


def crc32c(data: bytes) -> int:
    return int(_crc32c.crc32c(data))


class _Reader:
    """Varints and fields of one byte string; errors name ``where``."""

    def __init__(self, data: bytes, where: str) -> None:
        self.data, self.pos, self.where = data, 0, where

    def done(self) -> bool:
        return self.pos >= len(self.data)

    def varint(self) -> int:
        out = shift = 0
        while True:
            if self.pos >= len(self.data) or shift > 63:
                raise DataError(f"{self.where}: a varint runs past its record (truncated or corrupt)")
            b = self.data[self.pos]
            self.pos += 1
            out |= (b & 0x7F) << shift
            if not b & 0x80:
                return out
            shift += 7

    def take(self, n: int) -> bytes:
        if n < 0 or self.pos + n > len(self.data):
            raise DataError(f"{self.where}: a field of {n} bytes runs past its record (truncated or corrupt)")
        out = self.data[self.pos : self.pos + n]
        self.pos += n
        return out


def _fields(data: bytes, where: str) -> list[tuple[int, int | bytes]]:
    """A protobuf message as (field number, value): varints as ints, fixed32/64 and length-delimited as bytes."""
    r, out = _Reader(data, where), []
    while not r.done():
        key = r.varint()
        number, wire = key >> 3, key & 7
        if wire == 0:
            out.append((number, r.varint()))
        elif wire == 1:
            out.append((number, r.take(8)))
        elif wire == 2:
            out.append((number, r.take(r.varint())))
        elif wire == 5:
            out.append((number, r.take(4)))
        else:
            raise DataError(f"{where}: protobuf wire type {wire} of field {number} is not valid here (corrupt)")
    return out


@dataclass(frozen=True)
class BundleEntry:
    dtype: int
    shape: tuple[int, ...]
    shard_id: int
    offset: int
    size: int
    crc32c: int  # masked


def parse_entry(value: bytes, where: str) -> BundleEntry:
    dtype = shard = offset = size = crc = 0
    shape: list[int] = []
    has_crc = False
    for number, v in _fields(value, where):
        if number == 1 and isinstance(v, int):
            dtype = v
        elif number == 2 and isinstance(v, bytes):
            for n2, dim in _fields(v, where):
                if n2 == 2 and isinstance(dim, bytes):
                    shape.append(next((int(s) for n3, s in _fields(dim, where) if n3 == 1 and isinstance(s, int)), 0))
        elif number == 3 and isinstance(v, int):
            shard = v
        elif number == 4 and isinstance(v, int):
            offset = v
        elif number == 5 and isinstance(v, int):
            size = v
        elif number == 6 and isinstance(v, bytes) and len(v) == 4:
            crc, has_crc = struct.unpack("<I", v)[0], True
        elif number == 7:
            raise DataError(f"{where}: a sliced (partitioned) tensor; only whole tensors are read")
    if not has_crc:
        raise DataError(f"{where}: the BundleEntryProto has no crc32c (field 6)")
    return BundleEntry(dtype, tuple(shape), shard, offset, size, crc)


def _block(index: bytes, offset: int, size: int, where: str) -> bytes:
    """A block's contents after checking its trailer (compression none, masked crc32c)."""
    end = offset + size
    if offset < 0 or end + 5 > len(index):
        raise DataError(f"{where}: a block at {offset} of {size} bytes runs past the file ({len(index)} bytes; truncated)")
    contents, kind = index[offset:end], index[end]
    stored = struct.unpack("<I", index[end + 1 : end + 5])[0]
    if mask(crc32c(contents + bytes([kind]))) != stored:
        raise DataError(f"{where}: crc32c mismatch in the block at offset {offset} (corrupt)")
    if kind != 0:
        raise DataError(f"{where}: block at {offset} is compressed (type {kind}); TF writes tensor bundles uncompressed")
    return contents


def _entries(block: bytes, where: str) -> list[tuple[bytes, bytes]]:
    if len(block) < 4:
        raise DataError(f"{where}: a block of {len(block)} bytes has no restart count (corrupt)")
    restarts = struct.unpack("<I", block[-4:])[0]
    end = len(block) - 4 - 4 * restarts
    if end < 0:
        raise DataError(f"{where}: a block claims {restarts} restart points, more than it holds (corrupt)")
    r, key, out = _Reader(block[:end], where), b"", []
    while not r.done():
        shared, non_shared, length = r.varint(), r.varint(), r.varint()
        if shared > len(key):
            raise DataError(f"{where}: a key shares {shared} bytes with a previous key of {len(key)} (corrupt)")
        key = key[:shared] + r.take(non_shared)
        out.append((key, r.take(length)))
    return out


def _handle(value: bytes, where: str) -> tuple[int, int]:
    r = _Reader(value, where)
    return r.varint(), r.varint()


def read_index(path: Path) -> tuple[int, dict[str, BundleEntry]]:
    """``(num_shards, {tensor name: entry})`` of an ``.index`` file."""
    if not path.is_file():
        raise DataError(f"{path}: TF checkpoint index not found (expected PREFIX.index beside PREFIX.data-*)")
    data = path.read_bytes()
    where = str(path)
    if len(data) < FOOTER or struct.unpack("<Q", data[-8:])[0] != MAGIC:
        raise DataError(f"{path}: not a TF checkpoint index (no SSTable footer magic in the last 48 bytes; "
                        f"{len(data)} bytes: truncated or another file)")
    r = _Reader(data[-FOOTER:-8], where)
    r.varint(), r.varint()  # the metaindex block (empty in bundles)
    index_offset, index_size = r.varint(), r.varint()
    num_shards, found = -1, {}
    for _, handle in _entries(_block(data, index_offset, index_size, where), where):
        offset, size = _handle(handle, where)
        for key, value in _entries(_block(data, offset, size, where), where):
            if key == b"":
                fields = dict(_fields(value, where))
                num_shards = int(fields.get(1, 1))  # type: ignore[arg-type]
                if int(fields.get(2, 0)) != 0:  # type: ignore[arg-type]
                    raise DataError(f"{path}: a big-endian bundle; only little-endian is read")
            else:
                name = key.decode("utf-8", "replace")
                found[name] = parse_entry(value, f"{path}: tensor '{name}'")
    if num_shards < 1:
        raise DataError(f"{path}: no BundleHeaderProto (the entry of the empty key); not a tensor bundle index")
    return num_shards, found


def data_file(prefix: Path, shard: int, shards: int) -> Path:
    return Path(f"{prefix}.data-{shard:05d}-of-{shards:05d}")


def read_bundle(prefix: str | Path) -> dict[str, np.ndarray]:
    """Every tensor of the checkpoint ``prefix`` (crc32c of each checked), by name."""
    prefix = Path(prefix)
    shards, index = read_index(Path(str(prefix) + ".index"))
    blobs: dict[int, bytes] = {}
    out = {}
    for name, e in index.items():
        if not 0 <= e.shard_id < shards:
            raise DataError(f"{prefix}.index: tensor '{name}' is in shard {e.shard_id} of {shards}")
        if e.shard_id not in blobs:
            f = data_file(prefix, e.shard_id, shards)
            if not f.is_file():
                raise DataError(f"{f}: the checkpoint's data file is missing (named by {prefix}.index)")
            blobs[e.shard_id] = f.read_bytes()
        blob = blobs[e.shard_id]
        where = f"{data_file(prefix, e.shard_id, shards)}: tensor '{name}'"
        if e.offset + e.size > len(blob):
            raise DataError(f"{where}: bytes {e.offset}..{e.offset + e.size} lie past the file's {len(blob)} "
                            "(truncated)")
        raw = blob[e.offset : e.offset + e.size]
        if mask(crc32c(raw)) != e.crc32c:
            raise DataError(f"{where}: crc32c mismatch (corrupt)")
        out[name] = _tensor(raw, e, where)
    return out


def _tensor(raw: bytes, e: BundleEntry, where: str) -> np.ndarray:
    if e.dtype not in DTYPES:
        raise DataError(f"{where}: TF dtype {e.dtype} is not read (float, double, half, bfloat16, int8/32/64, "
                        "uint8, bool)")
    dt = np.dtype(DTYPES[e.dtype]).newbyteorder("<")
    count = int(np.prod(e.shape, dtype=np.int64))
    if count * dt.itemsize != len(raw):
        raise DataError(f"{where}: shape {e.shape} of {dt.name} needs {count * dt.itemsize} bytes, the entry "
                        f"has {len(raw)}")
    arr = np.frombuffer(raw, dtype=dt).reshape(e.shape)
    if e.dtype == DT_BFLOAT16:
        arr = (arr.astype(np.uint32) << 16).view(np.float32)
    return arr.astype(arr.dtype.newbyteorder("="))
