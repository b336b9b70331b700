"""Parameters and gradients as views into one contiguous flat buffer per dtype-less model (fp32).

:class:`FlatParams` moves every trainable parameter of a module into one 1-D ``params`` buffer and
points each ``p.grad`` at the matching slice of one 1-D ``grads`` buffer, so that

* gradient synchronisation is a single collective on ``grads`` (all-reduce, or reduce-scatter for
  the sharded optimizer), with no bucketing and no unflatten step;
* optimizers update the whole model with a handful of vectorised ops on ``params``;
* per-tensor quantities (LAMB trust ratios) come from segment reductions over ``lengths``.

Every view starts on an :data:`ALIGN_ELEMS`-element (256-byte) boundary of a 256-byte aligned
buffer: cuDNN's channels-last kernels and vectorised CUDA kernels need aligned pointers, and views
packed back to back crash DeepCAM on an H100 ("misaligned address"). The gaps between views are
zero, are segments of their own in ``lengths`` (so they stay out of per-tensor norms) and stay zero
under every optimizer (zero gradient, zero parameter). Sharded optimizers split the *real* elements
(:meth:`FlatParams.pack` / :meth:`FlatParams.unpack`), never the gaps. Parameters that only this rank
holds (model-parallel embedding tables) come last, after ``shared_size``: the instance's collectives
cover the shared prefix only. Parameters with sparse gradients (``outside``: large embedding tables)
are not in the buffers at all - a dense gradient of a 40M-row table is 20 GB - and are updated by
:class:`hpcbench.common.sparse_optim.SparseAdagrad`; :meth:`FlatParams.zero_grad` clears their gradients.
Autograd accumulates into the existing ``p.grad`` views in place; :meth:`FlatParams.check_grads`
repairs any view autograd replaced.
"""
from __future__ import annotations

from collections.abc import Iterator, Sequence

import torch
from torch import nn

from .errors import ConfigError


def _collective(name: str):  # noqa: ANN202 - the torch.distributed function, newest name first
    import torch.distributed as dist

    new = {"reduce_scatter": "reduce_scatter_single", "all_gather": "all_gather_single"}[name]
    old = {"reduce_scatter": "reduce_scatter_tensor", "all_gather": "all_gather_into_tensor"}[name]
    return getattr(dist, new, None) or getattr(dist, old)


def reduce_scatter(output: torch.Tensor, input: torch.Tensor) -> None:
    """Sum ``input`` over the default group; this rank receives its slice in ``output``."""
    _collective("reduce_scatter")(output, input)


def all_gather(output: torch.Tensor, input: torch.Tensor) -> None:
    """Concatenate every rank's ``input`` into ``output`` (rank order)."""
    _collective("all_gather")(output, input)


#: every parameter/gradient view starts at a multiple of this many fp32 elements (256 bytes)
ALIGN_ELEMS = 64


def _align(n: int) -> int:
    return -(-n // ALIGN_ELEMS) * ALIGN_ELEMS


def _aligned_zeros(n: int, device: torch.device, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """A zero vector whose first element is 256-byte aligned: a slice of a slightly larger
    allocation (CUDA's allocator aligns to 512 bytes, the CPU allocator guarantees only 64)."""
    raw = torch.zeros(n + ALIGN_ELEMS, device=device, dtype=dtype)
    skip = (-raw.data_ptr() // raw.element_size()) % ALIGN_ELEMS
    return raw[skip : skip + n]


class FlatParams:
    """One contiguous fp32 buffer for a module's trainable parameters and one for their grads.

    ``numel`` counts the parameters' elements; ``size`` the buffer (with the alignment gaps);
    ``offsets[i]`` is where parameter ``i`` starts in it (a multiple of :data:`ALIGN_ELEMS`).
    ``outside``: parameters left out of the buffers (sparse gradients); ``dtype``: fp32 in the
    harness (float64 only for equality tests).
    """

    def __init__(self, module: nn.Module, local: Sequence[nn.Parameter] = (), outside: Sequence[nn.Parameter] = (),
                 dtype: torch.dtype = torch.float32) -> None:
        self.names: list[str] = []
        params: list[nn.Parameter] = []
        local_ids = {id(p) for p in local}
        out_ids = {id(p) for p in outside}
        #: parameters outside the buffers, and those of them that every rank holds (not model parallel)
        self.outside = [p for p in module.parameters() if id(p) in out_ids and p.requires_grad]
        self.outside_shared = [p for p in self.outside if id(p) not in local_ids]
        named = [(n, p) for n, p in module.named_parameters() if p.requires_grad and id(p) not in out_ids]
        # parameters every rank holds first, then this rank's own (model parallel): the instance's
        # gradient sync and the start-up broadcast cover the prefix ``[:shared_size]`` only
        for name, p in sorted(named, key=lambda np_: id(np_[1]) in local_ids):
            self.names.append(name)
            params.append(p)
        if not params:
            raise ConfigError("the model has no trainable parameters")
        if any(p.dtype != dtype for p in params):
            raise ConfigError("build_model() must return an fp32 model; the harness sets precision"
                              if dtype == torch.float32 else f"FlatParams: every parameter must be {dtype}")
        device = params[0].device
        self.numels = [p.numel() for p in params]
        self.numel = sum(self.numels)
        self.offsets: list[int] = []
        end = 0
        for n in self.numels:
            self.offsets.append(_align(end))
            end = self.offsets[-1] + n
        self.size = _align(end)
        shared = [o + n for o, n, p in zip(self.offsets, self.numels, params) if id(p) not in local_ids]
        #: elements of the buffer that hold parameters every rank of the instance has (aligned)
        self.shared_size = _align(max(shared, default=0))
        self.has_local = bool(local_ids & {id(p) for p in params})
        self.device = device
        self.params = _aligned_zeros(self.size, device, dtype)
        self.grads = _aligned_zeros(self.size, device, dtype)
        for p, offset in zip(params, self.offsets):
            # as_strided keeps the parameter's memory format (channels-last conv weights stay so)
            view = _view(self.params, offset, p)
            view.copy_(p.detach())
            p.data = view
            p.grad = _view(self.grads, offset, p)
        self._params = params
        #: segment lengths over ``params``: each tensor and each (zero) gap on its own
        self.lengths = torch.tensor(_segments(self.offsets, self.numels, self.size), dtype=torch.int64, device=device)
        self.num_tensors = len(self.numels)

    def __iter__(self) -> Iterator[nn.Parameter]:
        return iter(self._params)

    def zero_grad(self) -> None:
        self.grads.zero_()
        for p in self.outside:
            p.grad = None

    def check_grads(self) -> None:
        """Copy any gradient autograd did not accumulate in place back into the flat buffer."""
        for p, off, n in zip(self._params, self.offsets, self.numels):
            g = p.grad
            if g is None:
                p.grad = _view(self.grads, off, p)
            elif g.data_ptr() != self.grads.data_ptr() + off * self.grads.element_size():
                view = _view(self.grads, off, p)
                view.copy_(g)
                p.grad = view

    # the real elements back to back ("packed"), for sharding and checkpoints ----------------------
    @torch.no_grad()
    def pack(self, buf: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """The parameters' elements of a ``size``-long buffer back to back (``numel`` long; written
        into the front of ``out`` when given), in one kernel."""
        parts = [buf[o : o + n] for o, n in zip(self.offsets, self.numels)]
        if out is None:
            return torch.cat(parts)
        return torch.cat(parts, out=out[: self.numel])

    @torch.no_grad()
    def unpack(self, packed: torch.Tensor, buf: torch.Tensor) -> None:
        """The inverse of :meth:`pack`: ``packed[:numel]`` into the tensors' places in ``buf``."""
        dst = [buf[o : o + n] for o, n in zip(self.offsets, self.numels)]
        torch._foreach_copy_(dst, list(packed[: self.numel].split(self.numels)))

    def unflatten(self, buf: torch.Tensor) -> list[torch.Tensor]:
        """Views of a ``size``-long buffer laid out like ``params``: one per parameter, with its shape and
        strides (the inverse of :meth:`flatten`)."""
        return [_view(buf, off, p) for off, p in zip(self.offsets, self._params)]

    @torch.no_grad()
    def flatten(self, tensors: list[torch.Tensor]) -> torch.Tensor:
        """``tensors`` (one per parameter, in order, any layout) placed like ``params`` (zero gaps)."""
        out = torch.zeros(self.size, dtype=tensors[0].dtype, device=self.device)
        for t, off, p in zip(tensors, self.offsets, self._params):
            _view(out, off, p).copy_(t.reshape(p.shape))  # through the parameter's own strides
        return out

    def shard_size(self, world: int) -> int:
        """Packed elements each of ``world`` ranks owns (the last rank's share is zero-padded)."""
        return -(-self.numel // world)

    def shard_pieces(self, rank: int, world: int) -> list[tuple[int, int, int]]:
        """(tensor index, offset in the buffer, length) of each tensor's part inside this rank's
        packed slice ``[rank * s, (rank + 1) * s)``, ``s = shard_size(world)``, in order."""
        size = self.shard_size(world)
        lo, hi = rank * size, (rank + 1) * size
        out: list[tuple[int, int, int]] = []
        start = 0
        for i, (off, n) in enumerate(zip(self.offsets, self.numels)):
            a, b = max(start, lo), min(start + n, hi)
            if a < b:
                out.append((i, off + a - start, b - a))
            start += n
        return out

    def shard_lengths(self, rank: int, world: int) -> torch.Tensor:
        """Per-tensor element counts inside this rank's packed slice, plus one for its zero padding."""
        counts = [0] * (self.num_tensors + 1)
        for i, _, n in self.shard_pieces(rank, world):
            counts[i] = n
        size = self.shard_size(world)
        counts[-1] = max(0, (rank + 1) * size - max(self.numel, rank * size))
        return torch.tensor(counts, dtype=torch.int64, device=self.device)

    def segment_values(self, per_tensor: Sequence[float], gap: float = 0.0) -> torch.Tensor:
        """One value per segment of :attr:`lengths` (each tensor's from ``per_tensor``, ``gap`` for the
        alignment gaps), for per-tensor factors such as a weight-decay mask."""
        if len(per_tensor) != self.num_tensors:
            raise ConfigError(f"{len(per_tensor)} per-tensor values for {self.num_tensors} parameter tensors")
        out: list[float] = []
        pos = 0
        for value, offset, n in zip(per_tensor, self.offsets, self.numels):
            if offset > pos:
                out.append(gap)
            out.append(float(value))
            pos = offset + n
        if self.size > pos:
            out.append(gap)
        return torch.tensor(out, dtype=torch.float32, device=self.device)

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {name: self.params[o : o + n].clone() for name, o, n in zip(self.names, self.offsets, self.numels)}


def _segments(offsets: list[int], numels: list[int], size: int) -> list[int]:
    """Lengths of the consecutive segments of a buffer: tensors, and the gaps before/after them."""
    out: list[int] = []
    pos = 0
    for offset, n in zip(offsets, numels):
        if offset > pos:
            out.append(offset - pos)
        out.append(n)
        pos = offset + n
    if size > pos:
        out.append(size - pos)
    return out


def _view(buf: torch.Tensor, offset: int, like: torch.Tensor) -> torch.Tensor:
    if like.is_contiguous():
        return buf[offset : offset + like.numel()].view_as(like)
    return buf[offset : offset + like.numel()].as_strided(like.shape, like.stride())


def segment_sum(values: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """Sums of consecutive segments of a 1-D tensor (empty segments give 0); no host sync."""
    return torch.segment_reduce(values, "sum", lengths=lengths, unsafe=True, initial=0.0)


def expand_segments(per_segment: torch.Tensor, lengths: torch.Tensor, total: int) -> torch.Tensor:
    """Each segment's value repeated over its elements (``total`` given, so no host sync)."""
    return torch.repeat_interleave(per_segment, lengths, output_size=total)
