"""The dataset cache (``data.cache = none | host | device``): read a rank's samples once, then serve
later epochs (and every evaluation) from memory.

What is cached is the *collated host batch before the spec's transform*, i.e. the storage dtype
(CosmoFlow int16 counts, DeepCAM what its collate gives), as one tensor per field with a leading
sample dimension over this rank's share. A later batch is ``index_select`` along dim 0 (on the GPU
for ``device``: no host work, no host-to-device copy; for ``host``: a gather into a pinned buffer and
a non-blocking copy), then the spec's transform where the uncached loader runs it, so a cached epoch
yields bit-identical batches.

Which samples a rank caches (its *share*) follows from :class:`~common.data.sampler.EpochSampler`:

* evaluation: the natural order dealt over the ranks, the same every epoch, so the share is exactly
  the rank's evaluation samples (filled by the first evaluation);
* training: every rule starts from a permutation seeded by ``(seed, epoch)`` over the whole split, so
  any sample of the split (of the node's part with ``data.node_local``) can come to any rank in a
  later epoch. The share is therefore every sample under the rank's data root. On one rank the first
  epoch fills it (less the ``n % batch`` samples it drops, read when a later epoch first asks); on
  ``size`` ranks each epoch brings the samples not seen yet, so the cache fills over epochs (after
  ``k`` epochs about ``1 - (1 - 1/size)**k`` of the share), and memory for the whole share is
  claimed, and checked, before the first epoch. With ``data.shuffle = local`` each rank keeps a fixed
  part of the split (:meth:`EpochSampler.fixed_part`) and the share is that part: 1/ranks of the split,
  filled by the first epoch.

A workload whose collate does not give a tree of tensors with a leading sample dimension (OC20's
graph batches), a split whose batches are randomly augmented from the samples (ResNet's training
crops: ``DatasetSpec.batch_cacheable(train)`` is false, a cached batch would freeze the augmentation),
and the DALI loader (whose graph consumes the raw samples), cache the validated samples themselves in host memory (:class:`SampleCache`) and collate them again; ``device`` is
refused for them. On a CPU device ``device`` means host memory (there is no other memory to use).
"""
from __future__ import annotations

import dataclasses
import os
import threading
import weakref
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, get_args

import numpy as np
import torch

from hpcbench.common.errors import ConfigError

from .sampler import EpochSampler
from .spec import DatasetSpec, SampleSource

CacheMode = Literal["none", "host", "device"]
CACHE_MODES: tuple[str, ...] = get_args(CacheMode)

GIB = 1 << 30
# What the cache may not take. Host: 10% of what is available and at least 1 GiB (the step, the
# reader threads, the page cache). Device: 25% of the GPU's memory stays free for the step's
# activations and workspaces, which do not exist yet when the cache is sized (after the model and
# the optimizer state).
HOST_MARGIN_FRACTION, HOST_MARGIN_MIN = 0.10, 1 * GIB
DEVICE_MARGIN_FRACTION = 0.25


def host_available_bytes() -> int:
    """MemAvailable from /proc/meminfo (what can be allocated without swapping); elsewhere free pages."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return int(os.sysconf("SC_AVPHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE"))


def device_memory(device: torch.device) -> tuple[int, int]:
    """(free, total) bytes of a CUDA device."""
    free, total = torch.cuda.mem_get_info(device)
    return int(free), int(total)


@dataclass(frozen=True)
class Budget:
    """How much memory a cache may take, and how that was decided (for the refusal message)."""

    where: str  # e.g. "host memory" or "cuda:0"
    available: int
    usable: int
    how: str


def budget(on_device: bool, device: torch.device, host_ranks: int = 1) -> Budget:
    if on_device:
        free, total = device_memory(device)
        margin = int(total * DEVICE_MARGIN_FRACTION)
        return Budget(str(device), free, max(0, free - margin),
                      f"{_size(free)} free of {_size(total)}, less {DEVICE_MARGIN_FRACTION:.0%} of the total kept "
                      "for the step")
    avail = host_available_bytes()
    margin = max(HOST_MARGIN_MIN, int(avail * HOST_MARGIN_FRACTION))
    ranks = max(1, host_ranks)
    usable = max(0, avail - margin) // ranks
    split = f", shared by the {ranks} ranks on this host" if ranks > 1 else ""
    return Budget("host memory", avail, usable,
                  f"MemAvailable {_size(avail)}, less a margin of {_size(margin)}{split}")


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    raise AssertionError  # pragma: no cover


def check_fits(mode: str, per_sample: int, samples: int, room: Budget, why: str) -> None:
    """Refuse, naming the sizes and the ways out, when ``samples * per_sample`` exceeds the budget."""
    total = per_sample * samples
    if total <= room.usable:
        return
    raise ConfigError(
        f"config key 'data.cache' = {mode!r}: this rank's share does not fit in {room.where}: {samples} samples "
        f"({why}) x {_size(per_sample)} per sample (measured on the share's first sample) = {_size(total)}, "
        f"but only {_size(room.usable)} may be used ({room.how}). Use data.cache = \"none\""
        + (" or \"host\"" if mode == "device" else "")
        + ", or more nodes with node-local staging (data.node_local: each node then holds and caches its part)")


def rank_share(sampler: EpochSampler) -> tuple[np.ndarray, str]:
    """The sample indices this rank can be asked for over all epochs, sorted, and why (module doc)."""
    if not sampler.train:
        return np.sort(sampler.indices()), f"rank {sampler.rank} of {sampler.size}'s evaluation samples"
    if sampler.shuffle == "local":
        return sampler.fixed_part(), f"rank {sampler.rank} of {sampler.size}'s fixed part (data.shuffle = local)"
    if getattr(sampler, "order", "shuffled") == "stored":  # StoredOrderSampler: the same rows every epoch
        return sampler.indices(), (f"rank {sampler.rank} of {sampler.size}'s rows of the stored order, the same "
                                   "every epoch")
    why = ("every training sample: the split is reshuffled over the ranks each epoch (data.shuffle = local "
           "keeps 1/ranks per rank)" if sampler.size > 1 else "every training sample")
    return np.arange(sampler.n, dtype=np.int64), why


# trees of tensors ---------------------------------------------------------------------------------
def tensor_leaves(batch: Any) -> list[torch.Tensor] | None:
    """The tensors of a dict/list/tuple tree in a fixed order; None if any leaf is not a tensor."""
    if isinstance(batch, torch.Tensor):
        return [batch]
    if isinstance(batch, Mapping):
        items: Sequence[Any] = list(batch.values())
    elif isinstance(batch, (list, tuple)):
        items = batch
    else:
        return None
    out: list[torch.Tensor] = []
    for item in items:
        sub = tensor_leaves(item)
        if sub is None:
            return None
        out += sub
    return out


def rebuild(template: Any, leaves: Sequence[torch.Tensor]) -> Any:
    """``template``'s tree with its tensors replaced by ``leaves`` (in :func:`tensor_leaves` order)."""
    return _rebuild(template, iter(leaves))


def _rebuild(node: Any, it: Iterator[torch.Tensor]) -> Any:
    # a module-level function, not a closure over itself: that would be a reference cycle holding
    # the batch's tensors (and a reused gather buffer) until the cyclic collector runs
    if isinstance(node, torch.Tensor):
        return next(it)
    if isinstance(node, Mapping):
        return {k: _rebuild(v, it) for k, v in node.items()}
    if isinstance(node, tuple) and hasattr(node, "_fields"):
        return type(node)(*(_rebuild(v, it) for v in node))
    return type(node)(_rebuild(v, it) for v in node)


def batchable(batch: Any) -> bool:
    """A batch of ONE sample is a tree of tensors that all have a leading sample dimension of 1."""
    leaves = tensor_leaves(batch)
    return bool(leaves) and all(t.dim() >= 1 and t.shape[0] == 1 for t in leaves)  # type: ignore[union-attr]


def nbytes(obj: Any) -> int:
    """Bytes of the arrays and tensors in a sample (nested dicts, lists, tuples, attributes)."""
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, np.ndarray):
        return int(obj.nbytes)
    if isinstance(obj, (bytes, bytearray, memoryview)):
        return len(obj)
    if isinstance(obj, Mapping):
        return sum(nbytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(nbytes(v) for v in obj)
    if hasattr(obj, "__dict__"):
        return sum(nbytes(v) for v in vars(obj).values())
    return 0


def owned(obj: Any) -> Any:
    """A copy of a sample that shares no buffer with its reader (e.g. an LMDB or mmap view)."""
    if isinstance(obj, np.ndarray):
        return np.array(obj)
    if isinstance(obj, torch.Tensor):
        return obj.clone()
    if isinstance(obj, memoryview):
        return bytes(obj)
    if isinstance(obj, Mapping):
        return {k: owned(v) for k, v in obj.items()}
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):
        return type(obj)(*(owned(v) for v in obj))
    if isinstance(obj, (list, tuple)):
        return type(obj)(owned(v) for v in obj)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return dataclasses.replace(obj, **{f.name: owned(getattr(obj, f.name))
                                           for f in dataclasses.fields(obj) if f.init})
    return obj


# the two caches -----------------------------------------------------------------------------------
class BatchCache:
    """Per-field tensors ``[share, ...]`` in the storage dtype, on the host or the device.

    ``put`` stores collated rows (host rows from reader threads; device rows from the training
    thread), ``take`` gathers a batch by slot. Each slot is written once, by whichever epoch first
    reads its sample; within an epoch a sample appears once, so reader threads never race on a slot.
    """

    def __init__(self, template: Any, share: np.ndarray, n: int, device: torch.device, pin: bool,
                 reuse: int = 2) -> None:
        leaves = tensor_leaves(template)
        assert leaves is not None
        self.template, self.device = template, device
        self.share = share
        self.slot_of = np.full(n, -1, dtype=np.int64)
        self.slot_of[share] = np.arange(share.size, dtype=np.int64)
        self.filled = np.zeros(share.size, dtype=bool)
        # zeros, not empty: host pages are touched now, so a later cache (and MemAvailable) sees them
        self.store = [torch.zeros((share.size, *t.shape[1:]), dtype=t.dtype, device=device) for t in leaves]
        self.pinned = pin and device.type == "cpu" and _pin_in_place(self, self.store)
        # host gathers land in reused buffers: a fresh 56 MB batch costs its page faults every time
        # (on the 2-core box 1 ms/sample of copying became 7-13 ms/sample of kernel time)
        self._np = [_numpy_view(t) for t in self.store] if device.type == "cpu" else [None] * len(self.store)
        self._out = HostBuffers(reuse)
        self._lock = threading.Lock()

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.store)

    def slots(self, idx: np.ndarray) -> np.ndarray:
        s = self.slot_of[np.asarray(idx, dtype=np.int64)]
        if s.size and s.min() < 0:
            raise IndexError(f"samples {np.asarray(idx)[s < 0].tolist()} are outside this rank's cached share")
        return s

    def missing(self, idx: np.ndarray) -> np.ndarray:
        """The samples of ``idx`` not stored yet (in ``idx``'s order)."""
        idx = np.asarray(idx, dtype=np.int64)
        return idx[~self.filled[self.slots(idx)]]

    def complete(self) -> bool:
        return bool(self.filled.all())

    def put(self, idx: np.ndarray, batch: Any) -> None:
        """Store the rows of a collated ``batch`` of samples ``idx`` (batch on the cache's device)."""
        slots = self.slots(idx)
        rows = tensor_leaves(batch)
        if rows is None or len(rows) != len(self.store):
            raise TypeError("a collated batch changed its structure between batches; it cannot be cached")
        where = torch.from_numpy(slots).to(self.device, non_blocking=True)
        for dst, src in zip(self.store, rows):
            dst.index_copy_(0, where, src.to(self.device, non_blocking=True))
        with self._lock:
            self.filled[slots] = True

    def stored(self) -> Any:
        """Every cached sample as one batch (``[share, ...]`` per field, the collated structure): the
        cache's own memory, for reading only (see ``DatasetSpec.transform_rows``)."""
        return rebuild(self.template, self.store)

    def take(self, slots: torch.Tensor, pinned_out: bool = False) -> Any:
        """The batch of the given slot indices (a tensor on the cache's device): a fresh tensor per
        field, so an in-place transform never touches the cache. ``pinned_out`` (host cache on a GPU
        run): gathered into page-locked buffers, ready for a non-blocking copy."""
        out = []
        for src, view in zip(self.store, self._np):
            if pinned_out:
                buf = torch.empty((slots.numel(), *src.shape[1:]), dtype=src.dtype, pin_memory=True)
                out.append(torch.index_select(src, 0, slots, out=buf))
            elif view is not None:
                dst = self._out.get((slots.numel(), *view.shape[1:]), view.dtype)
                out.append(torch.from_numpy(np.take(view, slots.numpy(), axis=0, out=dst, mode="clip")))
            else:
                out.append(torch.index_select(src, 0, slots))
        return rebuild(self.template, out)


class HostBuffers:
    """Reusable host arrays for gathered batches. Each hand-out is a fresh view of a pooled buffer;
    the buffer is handed out again only once that view is gone, i.e. once no tensor made from it
    (``torch.from_numpy`` keeps it alive, and so does every view of that tensor) is left, so a batch
    a consumer keeps is never overwritten. At most ``per_shape`` buffers per shape are kept."""

    def __init__(self, per_shape: int = 2) -> None:
        self.per_shape = max(1, per_shape)
        self._bufs: dict[tuple[Any, ...], list[tuple[np.ndarray, weakref.ref[np.ndarray]]]] = {}
        self._lock = threading.Lock()

    def get(self, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        with self._lock:
            entries = self._bufs.setdefault((shape, dtype.str), [])
            for k, (buf, ref) in enumerate(entries):
                if ref() is None:
                    view = buf.view()
                    entries[k] = (buf, weakref.ref(view))
                    return view
            buf = np.empty(shape, dtype)
            view = buf.view()
            if len(entries) < self.per_shape:
                entries.append((buf, weakref.ref(view)))
            return view


def _numpy_view(t: torch.Tensor) -> np.ndarray | None:
    try:
        return t.numpy()
    except (TypeError, RuntimeError):  # dtypes numpy lacks (bfloat16)
        return None


def _pin_in_place(owner: object, tensors: list[torch.Tensor]) -> bool:
    """Page-lock host tensors where they are (cudaHostRegister, as torch.cuda._pin_memory_utils
    does: no copy, and no rounding up to a power of two as the caching pinned allocator does).
    A failure is refused, not worked around: cudaHostRegister leaves its error as CUDA's last
    error, which the next kernel launch would then report as its own."""
    if not torch.cuda.is_available():
        return False
    rt = torch.cuda.cudart()
    done: list[int] = []
    for t in tensors:
        if t.numel() == 0:
            continue
        code = rt.cudaHostRegister(t.data_ptr(), t.numel() * t.element_size(), 0)
        if int(code) != 0:
            for ptr in done:
                rt.cudaHostUnregister(ptr)
            total = sum(x.numel() * x.element_size() for x in tensors)
            raise ConfigError(f"config key 'data.cache' = \"host\": page-locking the {_size(total)} cache failed "
                              f"(CUDA error {int(code)}: {_cuda_error_text(rt, code)}); use data.cache = \"none\", or "
                              "more nodes with node-local staging (data.node_local)")
        done.append(t.data_ptr())
    weakref.finalize(owner, _unpin, rt, done)
    return True


def _cuda_error_text(rt: Any, code: Any) -> str:
    try:
        return str(rt.cudaGetErrorString(code))
    except (TypeError, RuntimeError):
        return "see the CUDA runtime's error codes"


def _unpin(rt: Any, ptrs: list[int]) -> None:
    for ptr in ptrs:
        rt.cudaHostUnregister(ptr)


class SampleCache:
    """A :class:`SampleSource` that keeps every validated sample it reads (host memory): for
    workloads whose collate gives no tensor tree and for the DALI loader, which consume samples."""

    def __init__(self, source: SampleSource, share: np.ndarray) -> None:
        self.source, self.share = source, share
        self.samples: dict[int, Any] = {}

    def __len__(self) -> int:
        return len(self.source)

    def __getitem__(self, i: int) -> Any:
        got = self.samples.get(i)
        if got is None:
            got = self.samples[i] = owned(self.source[i])
        return got

    def costs(self) -> np.ndarray:
        return self.source.costs()

    def complete(self) -> bool:
        return len(self.samples) >= self.share.size


def build_cache(mode: str, spec: DatasetSpec, source: SampleSource, sampler: EpochSampler,
                device: torch.device, host_ranks: int = 1, samples_only: bool = False,
                what: str = "this loader", in_flight: int = 2) -> BatchCache | SampleCache | None:
    """The cache for one loader, after checking that the rank's share fits (refused with the sizes
    otherwise). ``samples_only``: the loader consumes samples, not collated batches (DALI);
    ``in_flight``: batches the loader may hold at once (host gather buffers kept for reuse)."""
    if mode not in CACHE_MODES:
        raise ConfigError(f"config key 'data.cache': {mode!r} is not allowed; expected one of "
                          + ", ".join(repr(m) for m in CACHE_MODES))
    if mode == "none":
        return None
    share, why = rank_share(sampler)
    if share.size == 0:
        return None
    first = owned(source[int(share[0])])
    on_device = mode == "device" and device.type == "cuda"
    augmented = not spec.batch_cacheable(sampler.train)
    template = None if samples_only or augmented else spec.collate([first])
    if template is None or not batchable(template):
        if mode == "device":
            reason = ("the DALI loader (train.loader = \"dali\") consumes host samples; use train.loader = "
                      "\"torch\" for a device cache" if samples_only else
                      f"the {spec.layout.name} dataset's training batches are randomly augmented from the "
                      "samples, which are kept instead" if augmented else
                      f"the {spec.layout.name} dataset's batches are not tensors with a leading sample "
                      f"dimension (its collate gives {type(template).__name__})")
            raise ConfigError(f"config key 'data.cache' = \"device\" is not available for {what}: {reason}; "
                              "use data.cache = \"host\" (the validated samples are kept in host memory and "
                              "collated again) or \"none\"")
        check_fits(mode, nbytes(first), int(share.size), budget(False, device, host_ranks), why)
        cache = SampleCache(source, share)
        cache.samples[int(share[0])] = first
        return cache
    per_sample = sum(t.numel() * t.element_size() for t in tensor_leaves(template) or [])
    check_fits(mode, per_sample, int(share.size), budget(on_device, device, host_ranks), why)
    store_on = device if on_device else torch.device("cpu")
    cache = BatchCache(template, share, sampler.n, store_on, pin=device.type == "cuda", reuse=in_flight)
    cache.put(np.asarray([share[0]]), template)
    return cache
