"""DimeNet++'s triplet message, y[ji] += a[kj] * (b @ w), with hand-written first and second derivatives.

The training step differentiates the energy twice (forces = -dE/dpos with a graph, then the loss on
the forces), so plain autograd materialises a dozen [triplets x channels] tensors per interaction
block (gathers, the ``b @ w`` expansion, products, their gradients) and streams each through main
memory. Here the forward, its gradient and that gradient's gradient are each ONE pass over the
triplets: only the per-edge [E, C] results, the small [T, K] basis gradients and the [K, C] weight
gradients are written. Every gathered or expanded row is recomputed from the saved inputs (``a``
[E, C], ``b`` [T, K], ``w`` [K, C] and the two index vectors) rather than kept.

On the CPU each pass is a C loop (``triplet_kernels.c``, built once per machine type by
:mod:`hpcbench.common.ckernel`): per triplet, the row of ``b @ w``, the gathered rows and their
products live in registers and L1, and the ``torch.get_num_threads()`` threads each take a span of
triplets with their own scatter targets, summed at the end (a fixed order: the result does not depend
on timing). Where the kernel cannot be built (no compiler, ``HPCBENCH_C_KERNELS=0``), on other dtypes
and on accelerators, the same passes run as torch ops, in chunks of ``CPU_CHUNK`` triplets on the CPU
(the temporaries of a chunk stay in cache) and in one piece on accelerators.

:func:`triplet_basis` is the other per-triplet op of DimeNet++: the blocks' spherical basis
projections, out[t] = sum_l c[t, l] * r[kj, l] over an edge table ``r`` [E, 7, P]; it is linear in
``r``, so its gradient is the transposed scatter and that scatter's gradient the gather again (two C
loops serve every order).

Shapes: ``a`` [E, C] per-edge states, ``b`` [T, K] per-triplet basis, ``w`` [K, C], ``idx_kj`` and
``idx_ji`` [T] edge indices; the result is [E, C]. The maths are exactly
``zeros(E, C).index_add_(0, idx_ji, a[idx_kj] * (b @ w))``; third derivatives are not supported.
"""
from __future__ import annotations

import ctypes
from pathlib import Path
from typing import Any

import torch
from torch import Tensor
from torch.autograd import Function
from torch.autograd.function import once_differentiable

from hpcbench.common import ckernel
from hpcbench.common.ckernel import address as _ptr
from hpcbench.common.ckernel import private_targets as _private
from hpcbench.common.ckernel import sum_targets as _sum_into

#: triplets per chunk on the CPU (torch path): [chunk, C] float32 temporaries of 0.25-0.5 MiB (C = 32-64)
#: stay in cache; 2048 was the fastest full-width step of 1024/2048/4096/8192 (2.07 vs 2.09-2.13 s CPU)
CPU_CHUNK = 2048
#: below this many triplets per thread the C passes run on one thread (a thread's private [E, C] targets
#: and their sum would cost more than the split saves)
MIN_TRIPLETS_PER_THREAD = 16384

KERNEL_SOURCE = Path(__file__).with_name("triplet_kernels.c")
_SUFFIX = {torch.float32: "f32", torch.float64: "f64"}
_SYMBOLS = tuple(f"{n}_{s}" for n in ("msg_fwd", "msg_grad", "msg_gradgrad", "basis_fwd", "basis_adj")
                 for s in _SUFFIX.values())
_MAX_CHANNELS = 1024  # MAXC in the C file (its scratch rows are on the stack)


def _spans(n: int, device: torch.device) -> list[tuple[int, int]]:
    """Row ranges of the chunks (one chunk on accelerators: there the temporaries are not the cost)."""
    if device.type != "cpu" or n <= CPU_CHUNK:
        return [(0, n)]
    return [(s, min(s + CPU_CHUNK, n)) for s in range(0, n, CPU_CHUNK)]


def _kernels(*tensors: Tensor) -> ctypes.CDLL | None:
    """The C kernels when they apply to these tensors (CPU, all float32 or all float64), else None."""
    a = tensors[0]
    if a.device.type != "cpu" or a.dtype not in _SUFFIX or not 0 < a.size(-1) <= _MAX_CHANNELS:
        return None
    if any(t.device.type != "cpu" or t.dtype != a.dtype for t in tensors[1:]):
        return None
    return ckernel.load(KERNEL_SOURCE, _SYMBOLS)


def _dims(*sizes: int) -> list[ctypes.c_int64]:
    return [ctypes.c_int64(n) for n in sizes]


def _thread_spans(n: int) -> list[tuple[int, int]]:
    return ckernel.spans(n, torch.get_num_threads(), MIN_TRIPLETS_PER_THREAD)


def _operands(a: Tensor, b: Tensor, w: Tensor, *rest: Tensor) -> tuple[Tensor, ...]:
    """The C loops' views of the operands: ``b`` keeps its row stride when its columns are unit-strided (a
    column slice of the fused [T, K * blocks] basis), everything else is made contiguous (no copy when it
    is). Only these locals are copied, never what autograd saved: a copy made inside a Function's forward
    is not on the graph, and the second derivative would not reach the tensor it was copied from."""
    return (a.contiguous(), ckernel.row_strided(b), w.contiguous(),
            *(x.contiguous() for x in rest))


def _check_indices(idx_kj: Tensor, idx_ji: Tensor, rows: int) -> None:
    """The C loops index without bounds checks: an index outside [0, rows) is an error here."""
    for name, idx in (("idx_kj", idx_kj), ("idx_ji", idx_ji)):
        if idx.numel() and (int(idx.min()) < 0 or int(idx.max()) >= rows):
            raise IndexError(f"triplet_message: {name} holds edge indices outside [0, {rows}) "
                             f"(min {int(idx.min())}, max {int(idx.max())})")


def _c_forward(lib: ctypes.CDLL, a: Tensor, b: Tensor, w: Tensor, kj: Tensor, ji: Tensor) -> Tensor:
    fn = getattr(lib, f"msg_fwd_{_SUFFIX[a.dtype]}")
    t, k, c = b.size(0), b.size(1), a.size(1)
    spans = _thread_spans(t)
    ys = _private(a.new_zeros(a.shape), len(spans))

    def work(i: int, s: int, e: int) -> None:
        if fn(*_dims(e - s, k, c, b.stride(0)), _ptr(a), _ptr(b, s), _ptr(w), _ptr(kj, s), _ptr(ji, s),
              _ptr(ys[i])) != 0:
            raise RuntimeError(f"triplet kernel msg_fwd refused C={c}")

    ckernel.run_spans(spans, work)
    _sum_into(ys)
    return ys[0]


def _c_grad(lib: ctypes.CDLL, gy: Tensor, a: Tensor, b: Tensor, w: Tensor, kj: Tensor,
            ji: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    fn = getattr(lib, f"msg_grad_{_SUFFIX[a.dtype]}")
    t, k, c = b.size(0), b.size(1), a.size(1)
    spans = _thread_spans(t)
    gas = _private(a.new_zeros(a.shape), len(spans))
    gws = _private(w.new_zeros(w.shape), len(spans))
    gb = b.new_empty(b.shape)

    def work(i: int, s: int, e: int) -> None:
        if fn(*_dims(e - s, k, c, b.stride(0)), _ptr(gy), _ptr(a), _ptr(b, s), _ptr(w), _ptr(kj, s),
              _ptr(ji, s), _ptr(gas[i]), _ptr(gb, s), _ptr(gws[i])) != 0:
            raise RuntimeError(f"triplet kernel msg_grad refused C={c}")

    ckernel.run_spans(spans, work)
    _sum_into(gas)
    _sum_into(gws)
    return gas[0], gb, gws[0]


def _c_gradgrad(lib: ctypes.CDLL, gy: Tensor, a: Tensor, b: Tensor, w: Tensor, kj: Tensor, ji: Tensor,
                gga: Tensor | None, ggb: Tensor | None, ggw: Tensor | None,
                need: tuple[bool, bool, bool, bool]) -> tuple[Tensor | None, ...]:
    fn = getattr(lib, f"msg_gradgrad_{_SUFFIX[a.dtype]}")
    t, k, c = b.size(0), b.size(1), a.size(1)
    spans = _thread_spans(t)
    dgys = _private(gy.new_zeros(gy.shape) if need[0] else None, len(spans))
    das = _private(a.new_zeros(a.shape) if need[1] else None, len(spans))
    db = b.new_zeros(b.shape) if need[2] else None
    dws = _private(w.new_zeros(w.shape) if need[3] else None, len(spans))
    gga, ggw = (None if x is None else x.contiguous() for x in (gga, ggw))
    ggb = None if ggb is None else ckernel.row_strided(ggb)  # a column slice of the [T, K * blocks] gradient: in place
    ldgg = k if ggb is None else ggb.stride(0)

    def work(i: int, s: int, e: int) -> None:
        if fn(*_dims(e - s, k, c, b.stride(0), ldgg), _ptr(gy), _ptr(a), _ptr(b, s), _ptr(w), _ptr(kj, s),
              _ptr(ji, s), _ptr(gga), _ptr(ggb, s), _ptr(ggw), _ptr(dgys[i]), _ptr(das[i]), _ptr(db, s),
              _ptr(dws[i])) != 0:
            raise RuntimeError(f"triplet kernel msg_gradgrad refused C={c}")

    ckernel.run_spans(spans, work)
    for parts in (dgys, das, dws):
        if parts[0] is not None:
            _sum_into(parts)
    return dgys[0], das[0], db, dws[0]


class _Message(Function):
    """y = scatter_ji(a[kj] * (b @ w))."""

    @staticmethod
    def forward(ctx: Any, a: Tensor, b: Tensor, w: Tensor, idx_kj: Tensor, idx_ji: Tensor) -> Tensor:
        lib = _kernels(a, b, w)
        if lib is not None:
            idx_kj, idx_ji = (i.to(torch.int64).contiguous() for i in (idx_kj, idx_ji))
            _check_indices(idx_kj, idx_ji, a.size(0))
            y = _c_forward(lib, *_operands(a, b, w), idx_kj, idx_ji)
        else:
            y = a.new_zeros(a.shape)
            for s, e in _spans(idx_kj.numel(), a.device):
                m = a.index_select(0, idx_kj[s:e]).mul_(b[s:e] @ w)
                y.index_add_(0, idx_ji[s:e], m)
        ctx.save_for_backward(a, b, w, idx_kj, idx_ji)
        return y

    @staticmethod
    def backward(ctx: Any, gy: Tensor) -> tuple[Tensor | None, ...]:
        a, b, w, idx_kj, idx_ji = ctx.saved_tensors
        ga, gb, gw = _MessageGrad.apply(gy.contiguous(), a, b, w, idx_kj, idx_ji)
        need = ctx.needs_input_grad
        return (ga if need[0] else None, gb if need[1] else None, gw if need[2] else None, None, None)


class _MessageGrad(Function):
    """Gradients of :class:`_Message` for the output gradient ``gy``:
    ga = scatter_kj(gy[ji] * (b @ w)), gb = (gy[ji] * a[kj]) @ w^T, gw = b^T (gy[ji] * a[kj])."""

    @staticmethod
    def forward(ctx: Any, gy: Tensor, a: Tensor, b: Tensor, w: Tensor, idx_kj: Tensor,
                idx_ji: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        # an output that no loss reaches (gw in the force pass) comes back as None, not a zero tensor
        # the second-order pass would multiply through
        ctx.set_materialize_grads(False)
        lib = _kernels(gy, a, b, w)
        if lib is not None:  # the indices come int64 and checked from _Message's C path
            ctx.save_for_backward(gy, a, b, w, idx_kj, idx_ji)
            a_, b_, w_, gy_ = _operands(a, b, w, gy)
            return _c_grad(lib, gy_, a_, b_, w_, idx_kj, idx_ji)
        ga = a.new_zeros(a.shape)
        gb_t = b.new_empty(b.shape[::-1])  # [K, T]: w @ u^T is the fast layout for K << C on CPU
        gw = w.new_zeros(w.shape)
        for s, e in _spans(idx_kj.numel(), a.device):
            kj, ji, bc = idx_kj[s:e], idx_ji[s:e], b[s:e]
            g = gy.index_select(0, ji)
            ga.index_add_(0, kj, (bc @ w).mul_(g))
            u = g.mul_(a.index_select(0, kj))
            gb_t[:, s:e] = w @ u.t()
            gw.addmm_(bc.t(), u)
        ctx.save_for_backward(gy, a, b, w, idx_kj, idx_ji)
        return ga, gb_t.t(), gw

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, gga: Tensor | None, ggb: Tensor | None,
                 ggw: Tensor | None) -> tuple[Tensor | None, ...]:
        gy, a, b, w, idx_kj, idx_ji = ctx.saved_tensors
        need_gy, need_a, need_b, need_w = ctx.needs_input_grad[:4]
        lib = _kernels(gy, a, b, w, *(x for x in (gga, ggb, ggw) if x is not None))
        if lib is not None and (gga is not None or ggb is not None or ggw is not None):
            a_, b_, w_, gy_ = _operands(a, b, w, gy)
            dgy, da, db, dw = _c_gradgrad(lib, gy_, a_, b_, w_, idx_kj, idx_ji, gga, ggb, ggw,
                                          (need_gy, need_a, need_b, need_w))
            return dgy, da, db, dw, None, None
        dgy = gy.new_zeros(gy.shape) if need_gy else None
        da = a.new_zeros(a.shape) if need_a else None
        db_t = b.new_zeros(b.shape[::-1]) if need_b else None  # [K, T], as gb in forward
        dw = w.new_zeros(w.shape) if need_w else None
        db = db_t.t() if db_t is not None else None
        if gga is None and ggb is None and ggw is None:
            return dgy, da, db, dw, None, None
        for s, e in _spans(idx_kj.numel(), a.device):
            kj, ji, bc = idx_kj[s:e], idx_ji[s:e], b[s:e]
            g = gy.index_select(0, ji)
            x = a.index_select(0, kj)
            # r = d(loss)/d(u) with u = g * x: from gb = u w^T and gw = b^T u
            r = None
            if ggb is not None:
                r = ggb[s:e] @ w
            if ggw is not None:
                r = bc @ ggw if r is None else r.addmm_(bc, ggw)
            v = gga.index_select(0, kj) if gga is not None else None  # d(loss)/d(ga) at kj
            if dgy is not None:
                acc = None
                if v is not None:
                    acc = (bc @ w).mul_(v)
                if r is not None:
                    acc = r * x if acc is None else acc.addcmul_(r, x)
                if acc is not None:
                    dgy.index_add_(0, ji, acc)
            if da is not None and r is not None:
                da.index_add_(0, kj, r * g)
            if db_t is None and dw is None:
                continue
            p = g * v if v is not None else None
            u = g.mul_(x) if ggw is not None or ggb is not None else None
            if db_t is not None:
                if p is not None:
                    db_t[:, s:e] += w @ p.t()
                if ggw is not None:
                    db_t[:, s:e] += ggw @ u.t()
            if dw is not None:
                if p is not None:
                    dw.addmm_(bc.t(), p)
                if ggb is not None:
                    dw.addmm_(ggb[s:e].t(), u)
        return dgy, da, db, dw, None, None


def _check_index_tensors(what: str, count: int, **indices: Tensor) -> None:
    """Index vectors: 1-D integer tensors of ``count`` entries (the C loops trust both)."""
    for name, idx in indices.items():
        if idx.dim() != 1 or idx.numel() != count:
            raise ValueError(f"{what}: {name} must be a 1-D vector of {count} edge indices, got shape {tuple(idx.shape)}")
        if idx.dtype not in (torch.int64, torch.int32, torch.int16, torch.uint8, torch.int8):
            raise TypeError(f"{what}: {name} must hold integers, got {idx.dtype}")


def triplet_message(a: Tensor, b: Tensor, w: Tensor, idx_kj: Tensor, idx_ji: Tensor) -> Tensor:
    """[E, C]: for every triplet t, row idx_ji[t] += a[idx_kj[t]] * (b[t] @ w)."""
    if a.dim() != 2 or b.dim() != 2 or w.dim() != 2 or tuple(w.shape) != (b.size(1), a.size(1)):
        raise ValueError(f"triplet_message: needs a [E, C], b [T, K], w [K, C]; got a {tuple(a.shape)}, "
                         f"b {tuple(b.shape)}, w {tuple(w.shape)}")
    _check_index_tensors("triplet_message", b.size(0), idx_kj=idx_kj, idx_ji=idx_ji)
    if idx_kj.device != a.device or idx_ji.device != a.device:
        raise ValueError(f"triplet_message: the indices are on {idx_kj.device}/{idx_ji.device}, the states on {a.device}")
    return _Message.apply(a, b, w, idx_kj, idx_ji)


def _c_basis(lib: ctypes.CDLL, name: str, rows_in: Tensor, c: Tensor, kj: Tensor, out: Tensor) -> Tensor:
    """basis_fwd (rows_in = r [E, L, P], out [T, P]) or basis_adj (rows_in = g [T, P], out z [E, L, P],
    accumulated: a private z per thread, summed)."""
    fn = getattr(lib, f"{name}_{_SUFFIX[rows_in.dtype]}")
    t, l, p = c.size(0), c.size(1), rows_in.size(-1)
    spans = _thread_spans(t)
    outs = _private(out, len(spans)) if name == "basis_adj" else [out] * len(spans)

    def work(i: int, s: int, e: int) -> None:
        src = _ptr(rows_in) if name == "basis_fwd" else _ptr(rows_in, s)
        dst = _ptr(outs[i], s) if name == "basis_fwd" else _ptr(outs[i])
        fn(*_dims(e - s, l, p), src, _ptr(c, s), _ptr(kj, s), dst)

    ckernel.run_spans(spans, work)
    if name == "basis_adj":
        _sum_into(outs)
    return outs[0]


def _gather_rows(r: Tensor, c: Tensor, kj: Tensor) -> Tensor:
    """out[t] = sum_l c[t, l] * r[kj[t], l]: [E, L, P], [T, L] -> [T, P]."""
    lib = _kernels(r, c)
    if lib is not None:
        return _c_basis(lib, "basis_fwd", r.contiguous(), c, kj, r.new_empty(c.size(0), r.size(2)))
    return torch.einsum("tl,tlp->tp", c, r.index_select(0, kj))


def _scatter_rows(g: Tensor, c: Tensor, kj: Tensor, rows: int) -> Tensor:
    """z[kj[t], l] += c[t, l] * g[t]: [T, P], [T, L] -> [E, L, P] (the adjoint of :func:`_gather_rows`)."""
    z = g.new_zeros(rows, c.size(1), g.size(1))
    lib = _kernels(g, c)
    if lib is not None:
        return _c_basis(lib, "basis_adj", g.contiguous(), c, kj, z)
    return z.index_add_(0, kj, c.unsqueeze(-1) * g.unsqueeze(1))


class _BasisGather(Function):
    """Linear in ``r`` (``c`` is a constant): its gradient is the scatter, and the scatter's is this gather."""

    @staticmethod
    def forward(ctx: Any, r: Tensor, c: Tensor, kj: Tensor) -> Tensor:
        ctx.save_for_backward(c, kj)
        ctx.rows = r.size(0)
        return _gather_rows(r, c, kj)

    @staticmethod
    def backward(ctx: Any, g: Tensor) -> tuple[Tensor | None, None, None]:
        c, kj = ctx.saved_tensors
        return _BasisScatter.apply(g, c, kj, ctx.rows), None, None


class _BasisScatter(Function):
    @staticmethod
    def forward(ctx: Any, g: Tensor, c: Tensor, kj: Tensor, rows: int) -> Tensor:
        ctx.save_for_backward(c, kj)
        return _scatter_rows(g, c, kj, rows)

    @staticmethod
    def backward(ctx: Any, gz: Tensor) -> tuple[Tensor | None, None, None, None]:
        c, kj = ctx.saved_tensors
        return _BasisGather.apply(gz, c, kj), None, None, None


def basis_on_edges(rad: Tensor) -> bool:
    """Whether :func:`triplet_basis` runs as C loops for tensors like ``rad`` (then projecting the spherical
    basis per edge first and gathering per triplet is the fast order; otherwise [T, S*R] then one GEMM)."""
    return _kernels(rad) is not None


def triplet_basis(r: Tensor, c: Tensor, idx_kj: Tensor) -> Tensor:
    """[T, P]: for every triplet t, sum over l of ``c[t, l] * r[idx_kj[t], l]``, for an edge table ``r``
    [E, L, P] and per-triplet weights ``c`` [T, L] that carry no gradient (DimeNet++'s angular basis,
    from detached positions). Differentiable to any order in ``r``."""
    if c.requires_grad:
        raise ValueError("triplet_basis: the per-triplet weights c must not require a gradient "
                         "(the angular basis is built from detached positions)")
    if r.dim() != 3 or c.dim() != 2 or r.size(1) != c.size(1):
        raise ValueError(f"triplet_basis: needs r [E, L, P] and c [T, L]; got r {tuple(r.shape)}, c {tuple(c.shape)}")
    _check_index_tensors("triplet_basis", c.size(0), idx_kj=idx_kj)
    if idx_kj.device != r.device:
        raise ValueError(f"triplet_basis: the indices are on {idx_kj.device}, the table on {r.device}")
    c = c.contiguous()
    if _kernels(r, c) is not None:
        idx_kj = idx_kj.to(torch.int64).contiguous()
        _check_indices(idx_kj, idx_kj, r.size(0))
    return _BasisGather.apply(r, c, idx_kj)


def prepare() -> str:
    """Build or load the C loops now (the workload's ``on_device``, before the timed run); "" when they will
    run, else why not."""
    if ckernel.load(KERNEL_SOURCE, _SYMBOLS) is None:
        return ckernel.reason(KERNEL_SOURCE)
    return ""
