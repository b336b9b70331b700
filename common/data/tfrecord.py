"""TFRecord framing and the ``tf.train.Example`` protobuf, without TensorFlow.

A TFRecord file is a sequence of records, each framed as::

    uint64 length (little endian) | uint32 masked_crc32c(length bytes) | payload | uint32 masked_crc32c(payload)

The whole file may be gzip-compressed (the CosmoFlow v1.0+ dataset is). ``Example`` is the protobuf
``Example{Features features=1}``, ``Features{map<string, Feature> feature=1}`` and ``Feature`` is a
oneof of ``BytesList bytes_list=1``, ``FloatList float_list=2`` or ``Int64List int64_list=3``.
This module encodes and decodes those few messages directly from the wire format.

Reading is zero-copy after the one read (and the one inflate): record payloads and ``bytes_list``
values are memoryviews into the file's bytes, CRCs are hardware CRC-32C (``crc32c``, which releases
the GIL on large buffers, as zlib does while inflating), so reader threads run in parallel.
"""
from __future__ import annotations

import gzip
import os
import struct
import zlib
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import BinaryIO, Union

import crc32c as _crc32c
import numpy as np

from hpcbench.common.atomic import atomic_write
from hpcbench.common.errors import DataError

GZIP_MAGIC = b"\x1f\x8b"
_MASK_DELTA = 0xA282EAD8
_U64 = struct.Struct("<Q")
_U32 = struct.Struct("<I")
HEADER_BYTES = 12  # length + its crc
FOOTER_BYTES = 4  # payload crc

FeatureValue = Union[bytes, list[bytes], np.ndarray]  # what encode_example takes
Feature = Union[list[memoryview], np.ndarray]  # what decode_example gives: bytes_list views or an array


# --- framing ------------------------------------------------------------------------------
def masked_crc(data: bytes | memoryview) -> int:
    """TFRecord's masked CRC-32C: rotate right by 15 bits and add a constant."""
    return _mask(_crc32c.crc32c(data))


def _mask(crc: int) -> int:
    return ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + _MASK_DELTA) & 0xFFFFFFFF


def frame(payload: bytes) -> bytes:
    """One framed record."""
    length = _U64.pack(len(payload))
    return b"".join((length, _U32.pack(masked_crc(length)), payload, _U32.pack(masked_crc(payload))))


def is_gzip(path: str | Path) -> bool:
    with open(path, "rb") as fh:
        return fh.read(2) == GZIP_MAGIC


def read_file_bytes(path: str | Path, size_hint: int = 0) -> bytes:
    """The uncompressed TFRecord stream of ``path`` (gzip detected from the magic bytes), read once.
    ``size_hint``: the expected stream size, the inflate buffer allocated up front (0: the gzip
    trailer's size)."""
    try:
        raw = Path(path).read_bytes()
    except OSError as exc:
        raise DataError(f"{path}: cannot read TFRecord file: {exc.strerror or exc}") from None
    return gunzip(raw, str(path), size_hint) if raw[:2] == GZIP_MAGIC else raw


def gunzip(raw: bytes, name: str, size_hint: int = 0) -> bytes:
    """Inflate a gzip file. The usual file is one member: it is inflated in one call into a buffer
    of the final size (zlib checks its CRC-32 and size) and taken when that CRC-32 and size are
    also the ones in the file's last 8 bytes, i.e. its trailer ends the file. Otherwise (several
    members, zero padding, trailing bytes) every member is read and checked by
    :func:`gzip.decompress`. The one case the fast path cannot tell from a single member is a file
    whose last member repeats the first byte for byte (``cat a.gz a.gz``); it reads as that member."""
    crc, isize = struct.unpack("<II", raw[-8:]) if len(raw) >= 18 else (0, 0)
    hint = size_hint or min(isize, 1032 * len(raw))  # deflate expands at most ~1032x
    try:
        out = zlib.decompress(raw, 31, max(hint, 1))
        if len(out) & 0xFFFFFFFF == isize and zlib.crc32(out) == crc:
            return out
        return gzip.decompress(raw)
    except (OSError, EOFError, zlib.error) as exc:  # gzip.BadGzipFile is an OSError
        raise DataError(f"{name}: corrupt gzip stream: {exc}") from None


def iter_records(data: bytes | memoryview, name: str = "<bytes>", verify: bool = True,
                 first_crc: int | None = None) -> Iterator[memoryview]:
    """Payloads of the framed records in ``data``; a bad frame is a DataError naming ``name``.
    ``first_crc``: the CRC-32C of the first payload, already computed while reading it."""
    view = memoryview(data)
    pos, n, index = 0, len(view), 0
    while pos < n:
        if n - pos < HEADER_BYTES:
            raise DataError(f"{name}: record {index} truncated in its header at byte {pos}")
        length_bytes = view[pos:pos + 8]
        (length,) = _U64.unpack(length_bytes)
        (length_crc,) = _U32.unpack(view[pos + 8:pos + 12])
        if verify and masked_crc(length_bytes) != length_crc:
            raise DataError(f"{name}: record {index} at byte {pos}: length CRC-32C mismatch (corrupt file)")
        start = pos + HEADER_BYTES
        end = start + length
        if end + FOOTER_BYTES > n:
            raise DataError(f"{name}: record {index} truncated: needs {length} payload bytes at byte {start}, "
                            f"file has {n - start - FOOTER_BYTES}")
        payload = view[start:end]
        (data_crc,) = _U32.unpack(view[end:end + FOOTER_BYTES])
        crc = _crc32c.crc32c(payload) if first_crc is None or index else first_crc
        if verify and _mask(crc) != data_crc:
            raise DataError(f"{name}: record {index} at byte {pos}: payload CRC-32C mismatch (corrupt file)")
        yield payload
        pos = end + FOOTER_BYTES
        index += 1


def single_record(data: bytes | memoryview, name: str = "<bytes>", payload_crc: int | None = None) -> memoryview:
    """The payload of a stream that must hold exactly one record (CRCs checked; ``payload_crc``:
    the payload's CRC-32C as :func:`read_into` computed it)."""
    first = next(iter_records(data, name, first_crc=payload_crc), None)
    if first is None:
        raise DataError(f"{name}: holds no TFRecord record; expected exactly one")
    end = HEADER_BYTES + len(first) + FOOTER_BYTES
    if end != len(data):
        raise DataError(f"{name}: a second TFRecord record starts at byte {end} ({len(data) - end} more bytes); "
                        "expected exactly one record per file")
    return first


def read_into(fh: BinaryIO, out: memoryview, chunk: int = 1 << 20) -> tuple[int, int]:
    """Read a framed stream from ``fh`` into ``out`` (up to its length) in ``chunk``-byte pieces,
    taking the CRC-32C of the first record's payload piece by piece while the piece is in cache
    (faster than a second pass over the whole buffer). Returns (bytes read, that CRC); the CRC
    covers only what was read, which :func:`single_record` then checks is the whole payload."""
    n = crc = 0
    end = -1  # end of the first payload, known once its length field is read
    while n < len(out):
        got = fh.readinto(out[n:n + chunk])
        if not got:
            break
        if end < 0 and n + got >= 8:
            end = HEADER_BYTES + _U64.unpack(out[:8])[0]
        lo, hi = max(n, HEADER_BYTES), min(n + got, end)
        if hi > lo:
            crc = _crc32c.crc32c(out[lo:hi], crc)
        n += got
    return n, crc


def record_index(data: bytes, name: str = "<bytes>") -> list[tuple[int, int]]:
    """``(offset, size)`` of each framed record in an *uncompressed* stream (DALI index format)."""
    out: list[tuple[int, int]] = []
    pos = 0
    for payload in iter_records(data, name, verify=False):
        size = HEADER_BYTES + len(payload) + FOOTER_BYTES
        out.append((pos, size))
        pos += size
    return out


def write_stream(fh: BinaryIO, payloads: Iterable[bytes], compress: bool = True, level: int = 6) -> None:
    """Write framed records to an open binary file, gzip-compressed when ``compress`` (no name or
    time in the gzip header, so the same records always give the same bytes)."""
    stream = b"".join(frame(p) for p in payloads)
    if compress:
        with gzip.GzipFile(filename="", fileobj=fh, mode="wb", compresslevel=level, mtime=0) as gz:
            gz.write(stream)
    else:
        fh.write(stream)


def write_records(path: str | Path, payloads: Iterable[bytes], compress: bool = True,
                  level: int = 6) -> None:
    """Write framed records atomically; gzip the stream when ``compress``."""
    payloads = list(payloads)
    stream = b"".join(frame(p) for p in payloads)

    def _verify(tmp: Path) -> None:
        if read_file_bytes(tmp) != stream:
            raise DataError(f"{path}: written file does not read back identically")

    with atomic_write(path, "wb", verify=_verify) as fh:
        _readable_by_all(fh.fileno())
        write_stream(fh, payloads, compress, level)


def _readable_by_all(fd: int) -> None:
    """Data files are shared: give them the umask's mode instead of mkstemp's 0600."""
    umask = os.umask(0)
    os.umask(umask)
    os.fchmod(fd, 0o666 & ~umask)


# --- protobuf wire format -----------------------------------------------------------------
def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        bits = value & 0x7F
        value >>= 7
        if value:
            out.append(bits | 0x80)
        else:
            out.append(bits)
            return bytes(out)


def _read_varint(buf: memoryview, pos: int, name: str) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(buf):
            raise DataError(f"{name}: truncated varint in Example protobuf")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise DataError(f"{name}: malformed varint in Example protobuf")


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited field (wire type 2)."""
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _fields(buf: memoryview, name: str) -> Iterator[tuple[int, int, memoryview | int]]:
    """(field number, wire type, value) of a message; value is bytes for wire type 2."""
    pos = 0
    while pos < len(buf):
        key, pos = _read_varint(buf, pos, name)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _read_varint(buf, pos, name)
            yield number, wire, value
        elif wire == 2:
            length, pos = _read_varint(buf, pos, name)
            if pos + length > len(buf):
                raise DataError(f"{name}: truncated field {number} in Example protobuf")
            yield number, wire, buf[pos:pos + length]
            pos += length
        elif wire == 5:
            yield number, wire, buf[pos:pos + 4]
            pos += 4
        elif wire == 1:
            yield number, wire, buf[pos:pos + 8]
            pos += 8
        else:
            raise DataError(f"{name}: unsupported protobuf wire type {wire} in field {number}")


def _encode_feature(value: FeatureValue) -> bytes:
    if isinstance(value, (bytes, bytearray)):
        return _field(1, _field(1, bytes(value)))
    if isinstance(value, list):
        return _field(1, b"".join(_field(1, bytes(v)) for v in value))
    arr = np.asarray(value)
    if arr.dtype.kind == "f":
        return _field(2, _field(1, arr.astype("<f4").tobytes()))  # packed floats
    if arr.dtype.kind in "iub":
        return _field(3, _field(1, b"".join(_varint(int(v) & 0xFFFFFFFFFFFFFFFF) for v in arr.ravel())))
    raise TypeError(f"cannot encode feature of dtype {arr.dtype}")


def encode_example(features: Mapping[str, FeatureValue]) -> bytes:
    """Serialize a ``tf.train.Example``: bytes -> bytes_list, float array -> float_list,
    integer array -> int64_list."""
    entries = b"".join(_field(1, _field(1, k.encode()) + _field(2, _encode_feature(v)))
                       for k, v in features.items())
    return _field(1, entries)


def _decode_feature(buf: memoryview, name: str) -> Feature:
    for number, wire, body in _fields(buf, name):
        assert isinstance(body, memoryview) or wire == 0
        if number == 1 and wire == 2:  # BytesList: views into the payload, no copy
            return [v for n, w, v in _fields(body, name) if n == 1 and w == 2]  # type: ignore[misc]
        if number == 2 and wire == 2:  # FloatList: packed or one fixed32 per element
            chunks = [bytes(v) for n, w, v in _fields(body, name) if n == 1 and w in (2, 5)]  # type: ignore[arg-type]
            return np.frombuffer(b"".join(chunks), dtype="<f4").astype(np.float32)
        if number == 3 and wire == 2:  # Int64List: packed or one varint per element
            values: list[int] = []
            for n, w, v in _fields(body, name):
                if n != 1:
                    continue
                if w == 0:
                    values.append(int(v))  # type: ignore[arg-type]
                else:
                    pos = 0
                    while pos < len(v):  # type: ignore[arg-type]
                        x, pos = _read_varint(v, pos, name)  # type: ignore[arg-type]
                        values.append(x)
            arr = np.array(values, dtype=np.uint64)
            return arr.astype(np.int64)
    return []


def value_offset(head: bytes | memoryview, key: str) -> int | None:
    """Where the first ``bytes_list`` value of feature ``key`` starts in a framed one-record stream,
    found from the message headers in ``head`` (the stream's first bytes) alone, or None when
    ``head`` does not reach it. A guess to place a read: only :func:`decode_example` on the whole
    record says where the value is (and whether the record is valid)."""
    buf, want, entry = memoryview(head), key.encode(), 1 << 3 | 2  # field 1, length-delimited
    try:
        pos = HEADER_BYTES
        tag, pos = _read_varint(buf, pos, "")
        if tag != entry:  # Example.features
            return None
        length, pos = _read_varint(buf, pos, "")
        end = pos + length
        while pos < end:  # Features.feature map entries: key (1) then value (2)
            tag, pos = _read_varint(buf, pos, "")
            length, pos = _read_varint(buf, pos, "")
            after = pos + length
            if tag == entry:
                tag, p = _read_varint(buf, pos, "")
                size, p = _read_varint(buf, p, "")
                if tag == entry and bytes(buf[p:p + size]) == want:
                    p += size
                    # value (field 2) -> Feature.bytes_list (1) -> BytesList.value (1)
                    for expected in (2 << 3 | 2, entry, entry):
                        tag, p = _read_varint(buf, p, "")
                        if tag != expected:
                            return None
                        _, p = _read_varint(buf, p, "")
                    return p
            pos = after
    except DataError:  # the head ends inside a header
        return None
    return None


def decode_example(payload: bytes | memoryview, name: str = "<record>") -> dict[str, Feature]:
    """Parse a serialized ``tf.train.Example`` into {key: bytes_list values (memoryviews into
    ``payload``) | float32 array | int64 array}; a feature with no value list is an empty list."""
    out: dict[str, Feature] = {}
    buf = memoryview(payload)
    for number, wire, features in _fields(buf, name):
        if number != 1 or wire != 2:
            continue
        for n, w, entry in _fields(features, name):  # type: ignore[arg-type]
            if n != 1 or w != 2:
                continue
            key, value = None, memoryview(b"")
            for en, ew, ev in _fields(entry, name):  # type: ignore[arg-type]
                if en == 1 and ew == 2:
                    raw_key = bytes(ev)  # type: ignore[arg-type]
                    try:
                        key = raw_key.decode()
                    except UnicodeDecodeError:
                        raise DataError(f"{name}: Example feature key is not UTF-8: {raw_key!r}") from None
                elif en == 2 and ew == 2:
                    value = ev  # type: ignore[assignment]
            if key is None:
                raise DataError(f"{name}: Example feature entry without a key")
            out[key] = _decode_feature(value, name)
    return out
