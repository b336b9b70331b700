"""Spatial parallelism for the 3D U-Net: S ranks share one volume, each holding a slab along one axis.

The source documents' scheme (NVIDIA, MLPerf Training v1.0/v1.1): a sample too large for one device,
or too few samples to scale by data parallelism alone, is split across a *spatial group* of ranks.

* **Halo convolution** (:class:`HaloConv3d`): a k x k x k convolution needs ``k // 2`` rows of each
  neighbour's slab. The rows are posted as non-blocking sends/receives and the slab's own convolution,
  zero-padded where the halos belong, is computed while they travel; the halos' share of the boundary
  rows is then a small convolution of each halo (followed by zeros) added in place, since the
  convolution is linear (the source documents' "error term"). Backward: the halos' input gradients
  first (small), sent back to the neighbours they came from while the slab's input and weight
  gradients are computed, then added on arrival.
  Stride 2 (the down-sampling convolutions) needs a halo below only (``k - s - pad`` rows above = 0)
  and every slab's depth must be a multiple of the stride so slab boundaries stay aligned.
* **Instance norm over the group** (:class:`GroupInstanceNorm3d`): per (sample, channel) statistics from
  the all-reduced partial sums ``sum x``, ``sum x^2``, ``count`` (made from each slab's own mean and
  variance, combined in float64; one all-reduce per layer, one more in backward).
* **Dice + cross-entropy from partial sums** (:func:`dice_ce_sums`, :func:`dice_ce_loss`): each rank sums
  intersection, prediction, target and cross-entropy over its voxels; one all-reduce gives every rank
  the whole-volume loss.

Transposed convolutions with kernel = stride (k2 s2) and 1x1x1 convolutions are local: no halo.

Gradients. Every collective here is differentiated as its exact adjoint (an all-reduce's backward is an
all-reduce of the gradients, a halo's gradient goes back to the rank it came from), so the program
the ranks run together is differentiated as a whole: the *objective is the sum over the group's ranks
of each rank's loss*. A loss made from all-reduced sums is the same value L on all S ranks, so the
group's objective is S x L and each rank ends with a *partial* parameter gradient; their sum over the
group is S x dL/dtheta. The harness sums parameter gradients over the instance and divides by the
instance's summed ``loss_count``: with each spatial rank reporting its (whole-volume) sample count,
that count is S times the samples, and the S cancels (``docs/unet3d.md``, "Spatial parallelism").
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from hpcbench.common.errors import ConfigError
from hpcbench.common.parallel import consecutive_groups
from hpcbench.common.precision import autocast_dtype

from .loss import SMOOTH_DR, SMOOTH_NR

#: the split axis of an (N, C, D, H, W) tensor: depth
DEPTH = 2


@dataclass(frozen=True)
class SpatialGroup:
    """This rank's place in a spatial group: ``size`` ranks, slab ``index`` along tensor dim ``axis``.

    ``group`` is the torch process group of those ranks (None when ``size == 1``); the slabs are in
    group-rank order, so group rank ``index - 1`` holds the slab before this one."""

    group: Any
    size: int
    index: int
    axis: int = DEPTH

    @property
    def has_prev(self) -> bool:
        return self.index > 0

    @property
    def has_next(self) -> bool:
        return self.index < self.size - 1


def new_spatial_groups(size: int, axis: int = DEPTH) -> SpatialGroup:
    """Split the default torch group into consecutive groups of ``size`` ranks (every rank must call
    this): ranks ``[g*size, (g+1)*size)`` share one volume; this rank's slab index is ``rank % size``.
    The harness gets the same group from its layout object (:class:`hpcbench.common.parallel.Parallel`);
    this is for tools and tests that run the spatial model alone."""
    try:
        place = consecutive_groups(size)
    except ConfigError as exc:
        raise ConfigError(f"config key 'model.spatial_group': {exc}") from None
    return SpatialGroup(place.group, place.size, place.index, axis)


# ---- volumes <-> slabs ------------------------------------------------------------------------------
def slab_range(length: int, sg: SpatialGroup, multiple: int = 1) -> tuple[int, int]:
    """(start, length) of this rank's slab of an axis of ``length``: equal slabs, each a multiple of
    ``multiple`` (the model's total down-sampling factor) so every stride-2 layer stays aligned."""
    if length % (sg.size * multiple):
        raise ConfigError(f"spatial parallelism: axis size {length} must be a multiple of {sg.size} ranks x "
                          f"{multiple} (the model's down-sampling factor) = {sg.size * multiple}")
    step = length // sg.size
    return sg.index * step, step


def take_slab(volume: torch.Tensor, sg: SpatialGroup, multiple: int = 1, axis: int | None = None) -> torch.Tensor:
    """This rank's slab of a whole volume every rank of the group holds (e.g. a batch all read)."""
    axis = sg.axis if axis is None else axis
    start, length = slab_range(volume.shape[axis], sg, multiple)
    return volume.narrow(axis, start, length)


def gather_slabs(slab: torch.Tensor, sg: SpatialGroup, axis: int | None = None) -> torch.Tensor:
    """The whole volume from every rank's (equal) slab, on every rank (not differentiable: evaluation)."""
    if sg.size == 1:
        return slab
    axis = sg.axis if axis is None else axis
    parts = [torch.empty_like(slab) for _ in range(sg.size)]
    dist.all_gather(parts, slab.contiguous(), group=sg.group)
    return torch.cat(parts, dim=axis)


# ---- differentiable collectives -----------------------------------------------------------------------
class _AllReduceSum(torch.autograd.Function):
    """Sum over the group; backward: the sum of the gradients (its adjoint)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Any) -> torch.Tensor:  # noqa: ANN401
        ctx.group = group
        out = x.clone()
        dist.all_reduce(out, group=group)
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:  # noqa: ANN401
        grad = grad.clone()
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


def all_reduce_sum(x: torch.Tensor, sg: SpatialGroup) -> torch.Tensor:
    """``x`` summed over the spatial group, differentiable (identity for one rank)."""
    return x if sg.size == 1 else _AllReduceSum.apply(x, sg.group)


class _Halo:
    """Non-blocking exchange of boundary rows with the two neighbours of a spatial group."""

    def __init__(self, sg: SpatialGroup) -> None:
        self.sg = sg
        self.works: list[Any] = []

    def send(self, t: torch.Tensor, to_next: bool, tag: int) -> None:
        if t.shape[self.sg.axis] == 0 or not (self.sg.has_next if to_next else self.sg.has_prev):
            return
        peer = self.sg.index + (1 if to_next else -1)
        self.works.append(dist.isend(t.contiguous(), group=self.sg.group, group_dst=peer, tag=tag))

    def recv(self, like: torch.Tensor, rows: int, from_next: bool, tag: int) -> torch.Tensor:
        shape = list(like.shape)
        shape[self.sg.axis] = rows
        buf = torch.zeros(shape, dtype=like.dtype, device=like.device)
        if rows and (self.sg.has_next if from_next else self.sg.has_prev):
            peer = self.sg.index + (1 if from_next else -1)
            self.works.append(dist.irecv(buf, group=self.sg.group, group_src=peer, tag=tag))
        return buf  # zeros at the volume's edges: the convolution's zero padding

    def wait(self) -> None:
        for w in self.works:
            w.wait()
        self.works.clear()


# ---- halo convolution ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Geometry:
    axis: int
    stride: tuple[int, ...]
    padding: tuple[int, ...]  # the layer's own: the slab's main convolution pads with zeros where halos go
    edge_padding: tuple[int, ...]  # the same with 0 along the split axis (halo corrections)
    dilation: tuple[int, ...]
    groups: int
    k: int  # kernel size along the axis
    s: int  # stride along the axis
    lo: int  # halo rows from the previous slab
    hi: int  # halo rows from the next slab
    overlap: bool = True  # False: wait for the halos before computing (benchmarks/unet3d_spatial.py's baseline)

    def low_rows(self, n_out: int) -> int:
        """Output rows at the bottom of the slab that see the lower halo."""
        return min(-(-self.lo // self.s), n_out)

    def high_first(self, d: int) -> int:
        """First output row that sees the upper halo (of a slab of ``d`` rows)."""
        return max(0, -(-(self.lo + d - self.k + 1) // self.s))

    def low_chunk(self, below: torch.Tensor, n_out: int) -> torch.Tensor:
        """The lower halo followed by zeros: the input of the low rows' correction."""
        return _zero_extend(below, (self.low_rows(n_out) - 1) * self.s + self.k - self.lo, self.axis, after=True)

    def high_chunk(self, above: torch.Tensor, d: int, n_out: int) -> torch.Tensor:
        rows = self.s * (n_out - 1) + self.k - self.s * self.high_first(d)
        return _zero_extend(above, rows - self.hi, self.axis, after=False)

    def correction(self, chunk: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return F.conv3d(chunk, w, None, self.stride, self.edge_padding, self.dilation, self.groups)

    def backward(self, grad: torch.Tensor, x: torch.Tensor, w: torch.Tensor, bias: bool, main: bool,
                 mask: list[bool]) -> tuple[Any, Any, Any]:
        """aten's convolution backward of the main convolution (``main``) or of a correction."""
        return torch.ops.aten.convolution_backward(
            grad, x, w, [w.shape[0]] if bias else None, self.stride, self.padding if main else self.edge_padding,
            self.dilation, False, [0, 0, 0], self.groups, mask)


def _zero_extend(t: torch.Tensor, rows: int, axis: int, after: bool) -> torch.Tensor:
    shape = list(t.shape)
    shape[axis] = rows
    zeros = t.new_zeros(shape)
    return torch.cat((t, zeros) if after else (zeros, t), dim=axis)


class _HaloConvFn(torch.autograd.Function):
    """The slab's own convolution, zero-padded where the halos belong, runs while the halos travel
    (it is most of the work); the halos' contribution to the boundary rows is then a small
    convolution of each halo followed by zeros, added in place (the convolution is linear)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,  # noqa: ANN401
                sg: SpatialGroup, g: _Geometry) -> torch.Tensor:
        dtype = autocast_dtype(x.device.type)  # autocast's cast, done here since the convolutions below run without it
        ctx.in_dtypes = (x.dtype, weight.dtype, None if bias is None else bias.dtype)
        if dtype is not None:
            x, weight = x.to(dtype), weight.to(dtype)
            bias = None if bias is None else bias.to(dtype)
        ax, d = g.axis, x.shape[g.axis]
        if d % g.s or d < max(g.lo, g.hi):
            raise ConfigError(f"spatial parallelism: a slab of {d} rows along axis {ax} cannot feed a convolution "
                              f"of stride {g.s} and halos {g.lo}/{g.hi}: make the volume's size a multiple of the "
                              f"ranks x the model's down-sampling factor")
        halo = _Halo(sg)
        use_lo, use_hi = bool(g.lo and sg.has_prev), bool(g.hi and sg.has_next)
        with torch.autocast(x.device.type, enabled=False):
            halo.send(x.narrow(ax, 0, g.hi), to_next=False, tag=0)  # my first rows: the previous slab's upper halo
            halo.send(x.narrow(ax, d - g.lo, g.lo), to_next=True, tag=1)  # my last rows: the next slab's lower halo
            below = halo.recv(x, g.lo, from_next=False, tag=1)
            above = halo.recv(x, g.hi, from_next=True, tag=0)
            if not g.overlap:
                halo.wait()
            out = F.conv3d(x, weight, bias, g.stride, g.padding, g.dilation, g.groups)  # while the halos travel
            halo.wait()
            n_out = out.shape[ax]
            low = g.low_chunk(below, n_out) if use_lo else None
            high = g.high_chunk(above, d, n_out) if use_hi else None
            if low is not None:
                out.narrow(ax, 0, g.low_rows(n_out)).add_(g.correction(low, weight))
            if high is not None:
                first = g.high_first(d)
                out.narrow(ax, first, n_out - first).add_(g.correction(high, weight))
        # the halos only (the chunks' zeros are rebuilt in backward): the neighbours' rows are the memory cost
        ctx.save_for_backward(x, weight, below if use_lo else None, above if use_hi else None)
        ctx.sg, ctx.g, ctx.has_bias = sg, g, bias is not None
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:  # noqa: ANN401
        x, weight, below, above = ctx.saved_tensors
        sg, g = ctx.sg, ctx.g
        ax, d = g.axis, x.shape[g.axis]
        grad = grad.to(x.dtype)
        n_out = grad.shape[ax]
        low = None if below is None else g.low_chunk(below, n_out)
        high = None if above is None else g.high_chunk(above, d, n_out)
        need_x, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        parts = []  # (output rows of a correction, its input chunk)
        if low is not None:
            parts.append((grad.narrow(ax, 0, g.low_rows(n_out)), low))
        if high is not None:
            first = g.high_first(d)
            parts.append((grad.narrow(ax, first, n_out - first), high))
        halo = _Halo(sg)
        if need_x:  # the halos' gradients first (small): they travel back while the main gradients are made
            if low is not None:
                g_low = g.backward(parts[0][0], low, weight, False, False, [True, False, False])[0]
                halo.send(g_low.narrow(ax, 0, g.lo), to_next=False, tag=2)
            if high is not None:
                g_high = g.backward(parts[-1][0], high, weight, False, False, [True, False, False])[0]
                halo.send(g_high.narrow(ax, g_high.shape[ax] - g.hi, g.hi), to_next=True, tag=3)
            from_next = halo.recv(x, g.lo, from_next=True, tag=2)  # for my last lo rows
            from_prev = halo.recv(x, g.hi, from_next=False, tag=3)  # for my first hi rows
            if not g.overlap:
                halo.wait()
        g_x, g_w, g_b = g.backward(grad, x, weight, ctx.has_bias, True, [need_x, need_w, ctx.has_bias])
        if need_w:
            for rows, chunk in parts:
                g_w += g.backward(rows, chunk, weight, False, False, [False, True, False])[1]
        if need_x:
            halo.wait()
            if g.lo and sg.has_next:
                g_x.narrow(ax, d - g.lo, g.lo).add_(from_next)
            if g.hi and sg.has_prev:
                g_x.narrow(ax, 0, g.hi).add_(from_prev)
            g_x = g_x.to(ctx.in_dtypes[0])
        if g_w is not None:
            g_w = g_w.to(ctx.in_dtypes[1])
        if g_b is not None and ctx.in_dtypes[2] is not None:
            g_b = g_b.to(ctx.in_dtypes[2])
        return g_x, g_w, g_b, None, None


class HaloConv3d(nn.Module):
    """A Conv3d of a spatial group: the same ``weight``/``bias`` parameters (names and state dicts are
    unchanged), its input and output slabs of one volume along ``sg.axis``."""

    def __init__(self, conv: nn.Conv3d, sg: SpatialGroup, overlap: bool = True) -> None:
        super().__init__()
        if conv.padding_mode != "zeros" or isinstance(conv.padding, str):
            raise ConfigError(f"spatial parallelism: Conv3d with padding {conv.padding!r} / mode "
                              f"{conv.padding_mode!r}; only numeric zero padding is supported")
        i = sg.axis - 2
        k, s, p, dil = conv.kernel_size[i], conv.stride[i], conv.padding[i], conv.dilation[i]
        if dil != 1 or not (k - s <= 2 * p < k):
            raise ConfigError(f"spatial parallelism: Conv3d kernel {k} stride {s} padding {p} dilation {dil} along "
                              f"the split axis; only 'same' convolutions (output = input / stride, k - s <= 2p < k, "
                              f"dilation 1) keep slab boundaries aligned")
        self.weight = conv.weight
        self.bias = conv.bias
        edge = list(conv.padding)
        edge[i] = 0
        self.geometry = _Geometry(sg.axis, tuple(conv.stride), tuple(conv.padding), tuple(edge), tuple(conv.dilation),
                                  conv.groups, k, s, p, max(0, k - s - p), overlap)
        self.sg = sg
        self.in_channels, self.out_channels = conv.in_channels, conv.out_channels

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _HaloConvFn.apply(x, self.weight, self.bias, self.sg, self.geometry)

    def extra_repr(self) -> str:
        g = self.geometry
        return (f"{self.in_channels}, {self.out_channels}, k={g.k}, s={g.s}, halo={g.lo}/{g.hi}, "
                f"rank {self.sg.index}/{self.sg.size}")


# ---- instance norm over the group --------------------------------------------------------------------
class _GroupInstanceNormFn(torch.autograd.Function):
    """Instance norm of slabs with whole-volume statistics; saves only the normalized slab (as torch's
    saves one tensor of the input's size) and differentiates by hand: the backward's two means over
    the volume are one more all-reduce, started before the weight and bias gradients are summed."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None,  # noqa: ANN401
                sg: SpatialGroup, eps: float) -> torch.Tensor:
        ctx.in_dtype = x.dtype
        x = _at_least_fp32(x)
        dims = tuple(range(2, x.dim()))
        # the slab's own mean and variance (torch's stable kernel), combined over the group in float64:
        # n * (var + mean^2) summed is the volume's sum of squares, exact enough after the local pass
        local_var, local_mean = torch.var_mean(x, dims, correction=0)
        n = float(x[0, 0].numel())
        mean64 = local_mean.double()
        sums = torch.stack((n * mean64, n * (local_var.double() + mean64 * mean64), torch.full_like(mean64, n)))
        if sg.size > 1:
            dist.all_reduce(sums, group=sg.group)
        mean = sums[0] / sums[2]
        var = (sums[1] / sums[2] - mean * mean).clamp(min=0.0)
        shape = (*x.shape[:2], *([1] * len(dims)))
        rstd = torch.rsqrt(var + eps).to(x.dtype).view(shape)
        xhat = (x - mean.to(x.dtype).view(shape)) * rstd
        y = xhat if weight is None else torch.addcmul(_channel(bias, x), xhat, _channel(weight, x))
        ctx.save_for_backward(xhat, rstd, weight)
        ctx.sg, ctx.dims, ctx.count = sg, dims, sums[2]
        return y

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:  # noqa: ANN401
        xhat, rstd, weight = ctx.saved_tensors
        dims, grad = ctx.dims, grad.to(xhat.dtype)
        g_hat = grad if weight is None else grad * _channel(weight, xhat)
        # d x = rstd * (g_hat - mean(g_hat) - xhat * mean(g_hat * xhat)), the means over the whole volume
        sums = torch.stack((g_hat.sum(dims), (g_hat * xhat).sum(dims))).double()
        work = dist.all_reduce(sums, group=ctx.sg.group, async_op=True) if ctx.sg.size > 1 else None
        g_w = g_b = None
        if weight is not None:  # this slab's part; the harness sums parameter gradients over the ranks
            g_w = (grad * xhat).sum((0, *dims)).to(weight.dtype)
            g_b = grad.sum((0, *dims)).to(weight.dtype)
        if work is not None:
            work.wait()
        means = (sums / ctx.count).to(xhat.dtype)
        shape = rstd.shape
        g_x = rstd * (g_hat - means[0].view(shape) - xhat * means[1].view(shape))
        return g_x.to(ctx.in_dtype), g_w, g_b, None, None


def _channel(v: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """A per-channel vector shaped to broadcast over (N, C, D, H, W), in ``like``'s dtype."""
    return v.to(like.dtype).view(1, -1, *([1] * (like.dim() - 2)))


class GroupInstanceNorm3d(nn.Module):
    """InstanceNorm3d whose statistics cover the whole volume: per (sample, channel) ``sum x``, ``sum x^2``
    and the voxel count (float64, from the slab's own mean and variance) summed over the group in one
    all-reduce; the gradient through the mean and variance is summed over the group too. Runs in fp32
    under autocast, as torch's."""

    def __init__(self, norm: nn.InstanceNorm3d, sg: SpatialGroup) -> None:
        super().__init__()
        if norm.track_running_stats:
            raise ConfigError("spatial parallelism: InstanceNorm3d(track_running_stats=True) is not supported")
        self.weight, self.bias = norm.weight, norm.bias  # the same parameters (None without affine)
        self.eps = norm.eps
        self.num_features = norm.num_features
        self.sg = sg

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _GroupInstanceNormFn.apply(x, self.weight, self.bias, self.sg, self.eps)


# ---- the model ---------------------------------------------------------------------------------------------
#: layers that mix nothing along the split axis (elementwise, or per voxel)
_LOCAL = (nn.ReLU, nn.LeakyReLU, nn.GELU, nn.SiLU, nn.Sigmoid, nn.Tanh, nn.Identity, nn.Dropout, nn.Dropout3d,
          nn.Sequential, nn.ModuleList, nn.ModuleDict)


def spatial_parallel(model: nn.Module, sg: SpatialGroup, overlap: bool = True) -> nn.Module:
    """``model`` (a single-device 3D CNN) made to run on slabs of a spatial group, in place: each Conv3d
    with a kernel wider than 1 along the axis becomes a :class:`HaloConv3d`, each InstanceNorm3d a
    :class:`GroupInstanceNorm3d`, on the same parameters. ConvTranspose3d must have kernel = stride and
    no padding along the axis (local). Layers that would mix the slabs otherwise (pooling, BatchNorm,
    upsampling) are refused by name. Every rank calls it with the same weights (the harness broadcasts).
    ``overlap=False`` waits for each halo before computing (the naive scheme, for comparison)."""
    if sg.size == 1:
        return model
    i = sg.axis - 2
    for name, module in list(model.named_modules()):
        for child_name, child in list(module.named_children()):
            path = f"{name}.{child_name}" if name else child_name
            if isinstance(child, nn.Conv3d):
                if child.kernel_size[i] > 1 or child.stride[i] > 1 or child.padding[i]:
                    setattr(module, child_name, HaloConv3d(child, sg, overlap))
            elif isinstance(child, nn.InstanceNorm3d):
                setattr(module, child_name, GroupInstanceNorm3d(child, sg))
            elif isinstance(child, nn.ConvTranspose3d):
                k, s, p = child.kernel_size[i], child.stride[i], child.padding[i]
                if k != s or p or child.output_padding[i]:
                    raise ConfigError(f"spatial parallelism: {path} is ConvTranspose3d(kernel {k}, stride {s}, "
                                      f"padding {p}) along the split axis; only kernel = stride without padding is local")
            elif not isinstance(child, (_LOCAL, HaloConv3d, GroupInstanceNorm3d)) and not _is_container(child):
                raise ConfigError(f"spatial parallelism: {path} is {type(child).__name__}, which may mix voxels "
                                  "across slabs; supported: Conv3d, ConvTranspose3d(k = s), InstanceNorm3d and "
                                  "elementwise layers")
    return model


def _is_container(module: nn.Module) -> bool:
    """A module with children of its own and no parameters or buffers directly on it (a block whose
    forward only wires its children; the children are checked one by one)."""
    own = list(module.named_parameters(recurse=False)) + list(module.named_buffers(recurse=False))
    return not own and any(True for _ in module.children())


# ---- Dice + cross-entropy from partial sums ---------------------------------------------------------------
def dice_ce_sums(logits: torch.Tensor, labels: torch.Tensor, include_background: bool = False) -> torch.Tensor:
    """This rank's partial sums per sample, (N, 3 * C' + 2): for each scored class the intersection
    ``sum p * t``, ``sum p``, ``sum t`` over the rank's voxels (``p`` = softmax), then the summed
    cross-entropy and the voxel count. ``labels``: (N, 1, ...) or (N, ...) integer classes."""
    labels = labels.reshape(logits.shape[0], *logits.shape[2:]).long()
    logp = F.log_softmax(_at_least_fp32(logits), dim=1)
    p = logp.exp()
    onehot = F.one_hot(labels, logits.shape[1]).movedim(-1, 1).to(p.dtype)
    if not include_background:
        p, onehot = p[:, 1:], onehot[:, 1:]
    dims = tuple(range(2, logits.dim()))
    inter, psum, tsum = (p * onehot).sum(dims), p.sum(dims), onehot.sum(dims)
    ce = -logp.gather(1, labels.unsqueeze(1)).sum(tuple(range(1, logits.dim())))
    count = torch.full_like(ce, float(labels[0].numel()))
    return torch.cat((inter, psum, tsum, ce.unsqueeze(1), count.unsqueeze(1)), dim=1)


def dice_ce_from_sums(sums: torch.Tensor) -> torch.Tensor:
    """Per-sample loss from whole-volume sums: ``(mean over classes of (1 - Dice) + mean cross-entropy) / 2``,
    Dice = ``(2 inter + smooth_nr) / (sum p + sum t + smooth_dr)`` with :mod:`.loss`'s smoothing terms (the
    reference's DiceCELoss for one sample)."""
    c = (sums.shape[1] - 2) // 3
    inter, psum, tsum = sums[:, :c], sums[:, c : 2 * c], sums[:, 2 * c : 3 * c]
    dice = (2.0 * inter + SMOOTH_NR) / (psum + tsum + SMOOTH_DR)
    ce = sums[:, 3 * c] / sums[:, 3 * c + 1]
    return ((1.0 - dice).mean(dim=1) + ce) / 2.0


def dice_ce_loss(logits: torch.Tensor, labels: torch.Tensor, sg: SpatialGroup,
                 include_background: bool = False) -> torch.Tensor:
    """Per-sample Dice + cross-entropy of whole volumes whose slabs the group's ranks hold: the partial
    sums of every rank, all-reduced (differentiable), then :func:`dice_ce_from_sums`. The same value on
    every rank of the group; see the module docstring for how its gradient adds up."""
    return dice_ce_from_sums(all_reduce_sum(dice_ce_sums(logits, labels, include_background), sg))


def _at_least_fp32(x: torch.Tensor) -> torch.Tensor:
    """Half-precision activations in fp32 for statistics (as autocast runs norms and losses); fp64 kept."""
    return x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
