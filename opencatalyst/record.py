"""Pickle-free encoding of one OC20 sample: a typed array container.

Layout of one encoded value::

    b"HPCBOC20" | uint8 version | uint32 header length (little endian) | JSON header | array bytes

The JSON header maps each field name to ``{"dtype", "shape", "offset"}`` (offset into the array
bytes) or, for scalars, ``{"value"}``. Decoding never executes code from the file: only numpy
dtypes from a fixed allow-list are accepted, and every array's byte range is checked.

The original OC20 encoding (a pickled ``torch_geometric.data.Data``) is read by
:func:`decode_pickled`, which callers may use only after an explicit ``--trust-pickle`` opt-in;
samples published without a graph get the reference's periodic radius graph there.
"""
from __future__ import annotations

import json
import math
import pickle
import struct
from collections.abc import Mapping
from typing import Any

import numpy as np

from hpcbench.common.data.values import all_finite, first_non_finite
from hpcbench.common.errors import DataError

MAGIC = b"HPCBOC20"
VERSION = 1
_ALLOWED = {"float32", "float64", "int64", "int32", "int16", "int8", "uint8", "bool"}
#: field -> (dtype, shape with "N" atoms / "E" edges); the S2EF fields of DESIGN.md section 4
#: (field, lowest, highest, what the values mean) of the per-atom integer fields: an atomic number outside the
#: model's embedding (rows 0..94, row 0 the padding atom of static shapes) would index past it or train on padding
MAX_ATOMIC_NUMBER = 94
INTEGER_RANGES: tuple[tuple[str, int, int, str], ...] = (
    ("atomic_numbers", 1, MAX_ATOMIC_NUMBER, "elements; 0 is the padding atom and the embedding ends at 94"),
    ("tags", 0, 2, "0 sub-surface, 1 surface, 2 adsorbate"),
    ("fixed", 0, 1, "1 for an atom held fixed"),
)
ARRAY_FIELDS: dict[str, tuple[str, tuple[str | int, ...]]] = {
    "pos": ("float32", ("N", 3)),
    "atomic_numbers": ("int64", ("N",)),
    "cell": ("float32", (1, 3, 3)),
    "edge_index": ("int64", (2, "E")),
    "cell_offsets": ("float32", ("E", 3)),
    "force": ("float32", ("N", 3)),
    "fixed": ("int8", ("N",)),
    "tags": ("int64", ("N",)),
}
SCALAR_FIELDS = ("natoms", "y", "sid", "fid")
#: names later fairchem versions give the S2EF targets (``AtomsToGraphs`` writes ``energy``/``forces``)
ALIASES = {"energy": "y", "forces": "force"}
PICKLE_PREFIXES = (b"\x80",)  # pickle protocol 2+ opcode PROTO
#: what to do about original (pickled) files; every command and flag in it exists (tests parse them)
TRUST_HINT = ("unpickling runs code from the file. If you trust its source, convert the files once with "
              "`hpcbench convert oc20 --src DIR --out NEW_DIR --trust-pickle`, or train on them as they are "
              "with `hpcbench train oc20 --data DIR --set data.trust_pickle=true` (slower start: see docs/oc20.md)")


def encode(sample: Mapping[str, Any]) -> bytes:
    """Encode a sample dict (numpy arrays and python/numpy scalars) without pickle."""
    header: dict[str, dict[str, Any]] = {}
    chunks: list[bytes] = []
    offset = 0
    # the real-valued fields first and in FLOAT_FIELDS order: stored float32 they are one run of bytes, which
    # decode checks for non-finite values in one pass (see _float_span)
    order = [f for f in FLOAT_FIELDS if f in sample] + [f for f in sample if f not in FLOAT_FIELDS]
    for name in order:
        value = sample[name]
        arr = np.asarray(value)
        if arr.ndim == 0 and name in SCALAR_FIELDS:
            header[name] = {"value": arr.item()}
            continue
        arr = np.ascontiguousarray(arr)
        if arr.dtype.name not in _ALLOWED:
            raise DataError(f"field '{name}': dtype {arr.dtype} is not storable; allowed: {sorted(_ALLOWED)}")
        raw = arr.tobytes()
        header[name] = {"dtype": arr.dtype.name, "shape": list(arr.shape), "offset": offset}
        chunks.append(raw)
        offset += len(raw)
    head = json.dumps(header, separators=(",", ":")).encode()
    return MAGIC + struct.pack("<BI", VERSION, len(head)) + head + b"".join(chunks)


def is_pickled(value: bytes) -> bool:
    return value[:1] in PICKLE_PREFIXES


def decode(value: bytes, where: str) -> dict[str, Any]:
    """Decode one value written by :func:`encode`; ``where`` names the file and key in errors."""
    header, body = _header_and_body(value, where)
    out: dict[str, Any] = {}
    for name, spec in header.items():
        if "value" in spec:
            out[name] = spec["value"]
            continue
        dtype, shape, off = spec.get("dtype"), spec.get("shape"), spec.get("offset")
        if dtype not in _ALLOWED or not isinstance(shape, list) or not isinstance(off, int):
            raise DataError(f"{where}: field '{name}' has a bad header entry {spec!r}")
        nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
        if off < 0 or off + nbytes > len(body):
            raise DataError(f"{where}: field '{name}' needs bytes {off}..{off + nbytes}, record body has {len(body)}")
        out[name] = np.frombuffer(body[off:off + nbytes], dtype=dtype).reshape(shape)
    validate(out, where, _float_span(header, body))
    return out


def float_values(value: bytes, where: str) -> np.ndarray | None:
    """The real-valued fields of an encoded record as the one array :func:`decode` checks (None for a record
    whose float fields are not back to back); for measuring that check (benchmarks/finite_checks.py). The
    record is decoded first, so its header entries are known to be sound."""
    decode(value, where)
    return _float_span(*_header_and_body(value, where))


def _header_and_body(value: bytes, where: str) -> tuple[dict[str, Any], memoryview]:
    """The JSON header and the array bytes of an encoded value, the container checked."""
    if not value.startswith(MAGIC):
        if is_pickled(value):
            raise DataError(f"{where}: value is a pickled object (original OC20 encoding); {TRUST_HINT}")
        raise DataError(f"{where}: not an hpcbench OC20 record (expected magic {MAGIC!r}, got {value[:8]!r})")
    fixed = len(MAGIC) + 5
    if len(value) < fixed:
        raise DataError(f"{where}: truncated record header ({len(value)} bytes)")
    version, hlen = struct.unpack("<BI", value[len(MAGIC):fixed])
    if version != VERSION:
        raise DataError(f"{where}: record version {version} is not supported (expected {VERSION})")
    if fixed + hlen > len(value):
        raise DataError(f"{where}: truncated record: header says {hlen} bytes, {len(value) - fixed} present")
    try:
        header = json.loads(value[fixed:fixed + hlen])
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise DataError(f"{where}: corrupt record header ({exc})") from None
    if not isinstance(header, dict) or not all(isinstance(v, dict) for v in header.values()):
        raise DataError(f"{where}: corrupt record header (expected an object of field entries)")
    return header, memoryview(value)[fixed + hlen:]


def _float_span(header: Mapping[str, Mapping[str, Any]], body: memoryview) -> np.ndarray | None:
    """The bytes of every FLOAT_FIELDS array as one float array, when they lie back to back in one float dtype
    (as :func:`encode` writes them); None otherwise (records of an older writer): then each field is checked
    on its own. One check of a few thousand values instead of four costs a fraction of the decode. The
    header's array entries must already be checked (types, byte ranges), as :func:`decode` does."""
    specs = [header.get(f) for f in FLOAT_FIELDS]
    if any(sp is None or "value" in sp for sp in specs):
        return None  # a field missing or stored as a scalar (decode checked only array entries): validate names it
    dtype = specs[0]["dtype"]
    if dtype not in ("float32", "float64") or any(sp["dtype"] != dtype for sp in specs):
        return None
    start = end = specs[0]["offset"]
    for sp in specs:
        if sp["offset"] != end:
            return None
        end += int(np.prod(sp["shape"], dtype=np.int64)) * np.dtype(dtype).itemsize
    return np.frombuffer(body[start:end], dtype=dtype)


#: fields that hold real numbers: stored as floats (not integers) and finite everywhere
FLOAT_FIELDS = ("pos", "cell", "cell_offsets", "force")


def validate(sample: Mapping[str, Any], where: str, floats: np.ndarray | None = None) -> None:
    """Check the S2EF fields are present with consistent shapes, the real-valued fields are floats, and
    positions, cell, forces and the energy are finite (a NaN force label would train on silently).
    ``floats``: the real-valued fields' values in one array (:func:`_float_span`), checked in one pass;
    only when that finds a non-finite value is each field looked at, to name it."""
    missing = [f for f in (*ARRAY_FIELDS, "natoms", "y") if f not in sample]
    if missing:
        raise DataError(f"{where}: missing field(s) {missing}; an OC20 S2EF sample needs {list(ARRAY_FIELDS)} "
                        "and natoms, y")
    n = int(sample["natoms"])
    e = int(np.shape(sample["edge_index"])[-1]) if np.ndim(sample["edge_index"]) == 2 else -1
    for name, (_, dims) in ARRAY_FIELDS.items():
        want = tuple(n if d == "N" else e if d == "E" else d for d in dims)
        got = tuple(np.shape(sample[name]))
        if got != want:
            raise DataError(f"{where}: field '{name}' has shape {list(got)}, expected {list(want)} "
                            f"(natoms={n}, edges={e})")
    ei = np.asarray(sample["edge_index"])
    if ei.size and (ei.min() < 0 or ei.max() >= n):
        raise DataError(f"{where}: edge_index refers to atoms outside 0..{n - 1}")
    for name, lo, hi, meaning in INTEGER_RANGES:
        arr = np.asarray(sample[name])
        bad = (arr < lo) | (arr > hi) | (arr != np.round(arr)) if arr.dtype.kind == "f" else (arr < lo) | (arr > hi)
        if arr.size and bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise DataError(f"{where}: field '{name}' is {arr[i].item()!r} at atom {i}; expected integers {lo}..{hi} "
                            f"({meaning})")
    checked = floats is not None and all_finite(floats)
    for name in FLOAT_FIELDS:
        arr = np.asarray(sample[name])
        if arr.dtype.kind != "f":
            raise DataError(f"{where}: field '{name}' is stored as {arr.dtype}; expected floating point "
                            f"({ARRAY_FIELDS[name][0]})")
        if not checked and not all_finite(arr):
            idx, _ = first_non_finite(arr)
            raise DataError(f"{where}: field '{name}' is not finite at index {list(idx)} (NaN or inf); every "
                            "value must be a finite number")
    try:
        energy = float(sample["y"])
    except (TypeError, ValueError):
        raise DataError(f"{where}: field 'y' (the energy) is {sample['y']!r}; expected a number") from None
    if not math.isfinite(energy):
        raise DataError(f"{where}: field 'y' (the energy) is {energy}; expected a finite number")


def _to_numpy(value: Any) -> Any:
    if hasattr(value, "detach"):  # torch tensor
        value = value.detach().cpu().numpy()
    if isinstance(value, np.ndarray) and value.ndim == 0:
        return value.item()
    return value


def from_data_object(obj: Any, where: str) -> dict[str, Any]:
    """A plain dict of numpy arrays from a (trusted) unpickled OC20 ``Data`` object or dict."""
    state = vars(obj) if hasattr(obj, "__dict__") else {}
    if isinstance(obj, Mapping):
        raw = dict(obj)
    elif state and "_store" not in state:
        # Data pickled by torch_geometric 1.x (the published OC20 LMDBs): its fields are plain
        # attributes, and a newer PyG's to_dict() on it raises, so read them as fairchem does
        raw = {k: v for k, v in state.items() if not k.startswith("_")}
    elif hasattr(obj, "to_dict"):
        try:
            raw = obj.to_dict()
        except Exception as exc:  # noqa: BLE001 - any failure of a foreign class is named, with the file
            raise DataError(f"{where}: could not read the fields of the unpickled {type(obj).__name__} "
                            f"({type(exc).__name__}: {exc})") from exc
    else:
        raise DataError(f"{where}: unpickled a {type(obj).__name__}, expected a torch_geometric Data or dict")
    # torch_geometric 1.x's Data.__init__ sets x, edge_index, edge_attr, y, pos, normal, face to None whatever was
    # given, so a sample written without edges (r_edges=False) holds edge_index None: a None field is an absent one
    raw = {k: v for k, v in raw.items() if v is not None}
    out: dict[str, Any] = {}
    for name, value in raw.items():
        if name in ALIASES:
            if ALIASES[name] in raw:
                continue  # both spellings present: the original name wins
            name = ALIASES[name]
        value = _to_numpy(value)
        try:
            if name in ARRAY_FIELDS:
                out[name] = np.asarray(value, dtype=ARRAY_FIELDS[name][0])
            elif name in SCALAR_FIELDS:
                out[name] = float(value) if name == "y" else int(value)
        except (TypeError, ValueError) as exc:
            raise DataError(f"{where}: field {name!r} holds a {type(value).__name__} that is not "
                            f"{'a number' if name in SCALAR_FIELDS else 'an array of ' + np.dtype(ARRAY_FIELDS[name][0]).name} "
                            f"({exc})") from None
    if "natoms" not in out and "pos" in out:
        out["natoms"] = int(out["pos"].shape[0])
    if "fixed" not in out and "pos" in out:
        out["fixed"] = np.zeros(out["natoms"], np.int8)
    from .graph import add_missing_graph

    add_missing_graph(out, where)  # published files made without edges (r_edges=False) carry none
    validate(out, where)
    return out


def decode_pickled(value: bytes, where: str) -> dict[str, Any]:
    """Decode an original OC20 value. Runs pickle: call only after the user opted in."""
    try:
        obj = pickle.loads(value)  # noqa: S301 - explicit --trust-pickle opt-in by the caller
    except ModuleNotFoundError as exc:
        raise DataError(f"{where}: unpickling needs the Python module {exc.name!r} that wrote it "
                        "(original OC20 values are torch_geometric Data objects: install torch_geometric)") from None
    except Exception as exc:  # any unpickling failure is a data problem of this file
        raise DataError(f"{where}: cannot unpickle value ({type(exc).__name__}: {exc})") from None
    return from_data_object(obj, where)
