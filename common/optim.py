"""Optimizers over a :class:`~common.flat.FlatParams` buffer: SGD, Adam, AdamW, Adagrad, LAMB, DistributedLAMB, LARS.

All of them are *sync-free* and graph-capturable: the learning rate arrives as a device tensor, the
step counter and every moment live on the device, and nothing calls ``.item()``. Each optimizer
also owns the gradient synchronisation of its instance:

* ``SGD``/``Adam``/``AdamW``/``LAMB``: one all-reduce of the flat gradient, divided by the ranks;
* ``DistributedLAMB``: one reduce-scatter of the flat gradient (this rank keeps 1/N of it and holds
  moments for only that 1/N), a global-norm all-reduce when clipping, one all-reduce of the
  per-tensor partial norms (parameter and update, concatenated) for the trust ratios, and one
  all-gather of the updated parameter shards back into the flat buffer.

LAMB follows the published algorithm with MLPerf's options: ``betas``, ``eps``, ``weight_decay``
(decoupled, added to the update), ``bias_correction``, ``grad_averaging`` (``m`` gets ``1-beta1``
times the gradient when true, the gradient itself when false), ``max_grad_norm`` (clip by the global
norm before the moments), and ``decay_exempt`` (per tensor: True leaves it out of the weight decay, as
BERT's reference exempts biases and LayerNorm weights; a per-segment factor, expanded like the trust
ratios). The trust ratio ``||p|| / ||u||`` scales each tensor's update (1 when either norm is 0), except
on the ``decay_exempt`` tensors, whose ratio is 1: the reference's ``LAMBOptimizer`` leaves the tensors it
exempts from weight decay out of the layer adaptation too (``exclude_from_layer_adaptation`` defaults to
``exclude_from_weight_decay``), as apex's LAMB does by default (``use_nvlamb=False``: no ratio for a
parameter group whose weight decay is 0). The mask applies at any weight decay, 0 included; with no mask
(DeepCAM) every tensor gets its ratio.

LARS follows the published algorithm (You, Gitman, Ginsburg 2017) as MLPerf's ResNet reference runs
it: per tensor, ``local = eta * ||p|| / (||g|| + wd * ||p|| + eps)`` (1 when either norm is 0),
``v = momentum * v + lr * local * (g + wd * p)``, ``p -= v`` (Nesterov: ``p -= momentum * v + lr *
local * (g + wd * p)``): the rate sits inside the momentum, as in the paper and the reference's
``LARSOptimizer``. Tensors in ``decay_exempt`` (BatchNorm parameters and biases, the reference's
``skip_list``) get neither weight decay nor the trust ratio: plain momentum SGD at ``lr``. The norms
come from the tensors' views of the flat buffer (the zero gaps are in none and stay zero). SGD takes
the same ``decay_exempt`` mask for its L2 weight decay (MLPerf ResNet's SGD decays only convolution
and classifier weights).

Parameters with sparse gradients live outside the flat buffer; :func:`build_optimizer` attaches a
row-wise Adagrad for them (``hpcbench.common.sparse_optim``, only beside the flat Adagrad).

``step(lr, skip=None)``: ``skip`` is an optional 0-d tensor (1 = found inf/nan under fp16 loss
scaling); a skipped step changes neither parameters, moments nor the step counter.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist

from .errors import ConfigError
from .flat import FlatParams, all_gather, expand_segments, reduce_scatter, segment_sum
from .runconfig import OptimConfig
from .sparse_optim import SparseAdagrad


from .flat_optim import FlatOptimizer, _assign, _momentum_skipping  # noqa: F401 - re-exported


class SGD(FlatOptimizer):
    """PyTorch SGD semantics (L2 weight decay, momentum buffer starting at the first gradient);
    ``decay_exempt`` tensors get no weight decay. ``weight_decay_form = "keras_l2"``: the decay term is
    ``2 weight_decay p``, the gradient of Keras' ``regularizers.l2(weight_decay)`` loss term. ``momentum_form = "keras"``: the rate inside the velocity,
    ``v = m v + lr d``, ``p -= v`` (Nesterov: ``p -= m v + lr d``), as Keras' SGD (equal to torch's form while
    the rate is constant)."""

    def __init__(self, flat: FlatParams, cfg: OptimConfig, world: int = 1, rank: int = 0,
                 decay_exempt: Sequence[bool] = ()) -> None:
        super().__init__(flat, cfg, world, rank)
        if cfg.momentum:
            self.state["momentum"] = self._zeros(flat.size)
        #: (offset, length) of the tensors kept out of the weight decay (only when there is decay)
        self.exempt = [(o, n) for o, n, e in zip(flat.offsets, flat.numels, decay_exempt) if e] \
            if cfg.weight_decay else []
        #: the factor of p in the gradient's decay term
        self.decay = cfg.weight_decay * (2.0 if cfg.weight_decay_form == "keras_l2" else 1.0)

    def _update(self, p, g, lr, skip) -> None:  # noqa: ANN001
        c = self.cfg
        d = g.add(p, alpha=self.decay) if self.decay else g
        if self.exempt:  # their plain gradient back in place of the decayed one
            torch._foreach_copy_([d[o : o + n] for o, n in self.exempt], [g[o : o + n] for o, n in self.exempt])
        if c.momentum and c.momentum_form == "keras":  # torch's momentum step on the rate-scaled gradient
            step = _momentum_skipping(self.state["momentum"], lr * d, c.momentum, c.nesterov, skip)
            _assign(p, p - step, skip)
            return
        if skip is None:  # the common case, fully in place: 2-4 kernels for the whole model
            if c.momentum:
                buf = self.state["momentum"]
                buf.mul_(c.momentum).add_(d)
                d = d.add(buf, alpha=c.momentum) if c.nesterov else buf
            p.addcmul_(d, lr, value=-1.0)
            return
        if c.momentum:
            d = _momentum_skipping(self.state["momentum"], d, c.momentum, c.nesterov, skip)
        _assign(p, p - lr * d, skip)


class Adam(FlatOptimizer):
    """Adam (``decoupled=False``: L2 decay in the gradient) or AdamW (decoupled decay); ``max_grad_norm`` > 0 clips
    the instance's averaged gradient by its global norm first, as ``torch.nn.utils.clip_grad_norm_`` (factor
    ``min(1, max_norm / (norm + 1e-6))``)."""

    def __init__(self, flat: FlatParams, cfg: OptimConfig, world: int = 1, rank: int = 0, decoupled: bool = True) -> None:
        super().__init__(flat, cfg, world, rank)
        self.decoupled = decoupled
        self.state["exp_avg"] = self._zeros(flat.size)
        self.state["exp_avg_sq"] = self._zeros(flat.size)

    def _update(self, p, g, lr, skip) -> None:  # noqa: ANN001
        c = self.cfg
        b1, b2 = c.betas
        m, v = self.state["exp_avg"], self.state["exp_avg_sq"]
        if c.max_grad_norm > 0:  # torch.nn.utils.clip_grad_norm_ on the averaged gradient (the gaps are zero)
            g = g * torch.clamp(c.max_grad_norm / (g.norm() + 1e-6), max=1.0)
        if c.weight_decay and not self.decoupled:
            g = g.add(p, alpha=c.weight_decay)
        t = self.step_count + 1
        if skip is None:  # in place
            m.lerp_(g, 1 - b1)
            v.mul_(b2).addcmul_(g, g, value=1 - b2)
            denom = (v / (1 - b2**t)).sqrt_().add_(c.eps)
            if c.weight_decay and self.decoupled:
                p.mul_(1 - lr * c.weight_decay)
            p.addcdiv_(m * (lr / (1 - b1**t)), denom, value=-1.0)
            return
        _assign(m, torch.lerp(m, g, 1 - b1), skip)
        _assign(v, b2 * v + (1 - b2) * g * g, skip)
        denom = (v / (1 - b2**t)).sqrt() + c.eps
        new_p = p * (1 - lr * c.weight_decay) if (c.weight_decay and self.decoupled) else p
        _assign(p, new_p - lr * (m / (1 - b1**t)) / denom, skip)


class LAMB(FlatOptimizer):
    """LAMB on the whole flat buffer of this rank (moments for all parameters); ``decay_exempt`` tensors get
    neither weight decay nor the trust ratio (see the module docstring)."""

    def __init__(self, flat: FlatParams, cfg: OptimConfig, world: int = 1, rank: int = 0,
                 decay_exempt: Sequence[bool] = ()) -> None:
        super().__init__(flat, cfg, world, rank)
        n = self._local_size()
        self.state["exp_avg"] = self._zeros(n)
        self.state["exp_avg_sq"] = self._zeros(n)
        self.lengths = self._local_lengths()
        #: per-segment weight decay when some tensors are exempt; None: ``cfg.weight_decay`` everywhere
        self.decay: torch.Tensor | None = None
        #: per segment: False where the trust ratio is fixed at 1 (exempt tensors; gaps, padding); None: all adapt
        self.adapt: torch.Tensor | None = None
        if any(decay_exempt):
            if len(decay_exempt) != flat.num_tensors:
                raise ConfigError(f"{len(decay_exempt)} weight-decay flags for {flat.num_tensors} parameter tensors")
            self.adapt = self._segment_values([0.0 if exempt else 1.0 for exempt in decay_exempt]) > 0
            if cfg.weight_decay:
                self.decay = self._segment_values([0.0 if exempt else cfg.weight_decay for exempt in decay_exempt])

    def _segment_values(self, per_tensor: list[float]) -> torch.Tensor:
        return self.flat.segment_values(per_tensor)

    def _local_size(self) -> int:
        return self.flat.size

    def _local_lengths(self) -> torch.Tensor:
        return self.flat.lengths

    def _allreduce(self, t: torch.Tensor) -> torch.Tensor:
        return t  # the full buffer is local: norms are complete

    def _update(self, p, g, lr, skip) -> None:  # noqa: ANN001
        c = self.cfg
        b1, b2 = c.betas
        if c.max_grad_norm > 0:
            gnorm = self._allreduce((g * g).sum()).sqrt()
            g = g / torch.clamp(gnorm / c.max_grad_norm, min=1.0)
        m, v = self.state["exp_avg"], self.state["exp_avg_sq"]
        new_m = b1 * m + ((1 - b1) if c.grad_averaging else 1.0) * g
        new_v = b2 * v + (1 - b2) * g * g
        _assign(m, new_m, skip)
        _assign(v, new_v, skip)
        if c.bias_correction:
            t = self.step_count + 1
            new_m, new_v = new_m / (1 - b1**t), new_v / (1 - b2**t)
        u = new_m / (new_v.sqrt() + c.eps)
        if self.decay is not None:
            u = u + expand_segments(self.decay, self.lengths, p.numel()) * p
        elif c.weight_decay:
            u = u + c.weight_decay * p
        norms = self._allreduce(torch.cat([segment_sum(p * p, self.lengths), segment_sum(u * u, self.lengths)]))
        pn, un = norms.sqrt().chunk(2)
        adapt = (pn > 0) & (un > 0)
        if self.adapt is not None:  # the exempt tensors: ratio 1
            adapt &= self.adapt
        ratio = torch.where(adapt, pn / un, torch.ones_like(pn))
        _assign(p, p - lr * expand_segments(ratio, self.lengths, p.numel()) * u, skip)


class DistributedLAMB(LAMB):
    """LAMB with the optimizer state sharded over the instance's ranks (ZeRO-1 style).

    The shards split the parameters' *real* elements (packed back to back, see
    :meth:`FlatParams.pack`), not the aligned buffer with its gaps: rank ``r`` owns packed elements
    ``[r*s, (r+1)*s)``, ``s = ceil(numel / world)``. Each step packs the gradient into one reusable
    buffer, reduce-scatters it, updates this rank's shard, all-gathers the shards back into the same
    buffer and unpacks it into the aligned ``params`` (two extra copies of the model per step, one
    extra buffer of its size; fixed addresses, so the step stays graph-capturable).
    """

    sharded = True

    def __init__(self, flat: FlatParams, cfg: OptimConfig, world: int = 1, rank: int = 0,
                 decay_exempt: Sequence[bool] = ()) -> None:
        super().__init__(flat, cfg, world, rank, decay_exempt)
        n = flat.shard_size(world)
        self.packed = torch.zeros(n * world, device=flat.device)  # the tail past numel stays zero
        self.shard = torch.zeros(n, device=flat.device)  # this rank's parameters (packed)
        self.grad_shard = torch.zeros(n, device=flat.device)  # this rank's reduced gradient
        # (offset in the aligned buffer, length) of each piece of this rank's packed range
        self.pieces = [(off, k) for _, off, k in flat.shard_pieces(rank, world)]

    def _local_size(self) -> int:
        return self.flat.shard_size(self.world)

    def _local_lengths(self) -> torch.Tensor:
        return self.flat.shard_lengths(self.rank, self.world)

    def _segment_values(self, per_tensor: list[float]) -> torch.Tensor:
        # shard_lengths: one segment per tensor (empty where the shard holds none of it), then padding
        return torch.tensor([*per_tensor, 0.0], dtype=torch.float32, device=self.flat.device)

    def _allreduce(self, t: torch.Tensor) -> torch.Tensor:
        if self.world > 1:
            dist.all_reduce(t)
        return t

    def step(self, lr: torch.Tensor, skip: torch.Tensor | None = None) -> None:
        flat = self.flat
        self.flat.pack(flat.grads, out=self.packed)
        if self.world > 1:
            g = self.grad_shard
            reduce_scatter(g, self.packed)
            g.div_(self.world)
        else:
            g = self.packed
        if self.pieces:
            torch.cat([flat.params[o : o + k] for o, k in self.pieces], out=self.shard[: sum(k for _, k in self.pieces)])
        self._update(self.shard, g, lr, skip)
        if self.world > 1:
            all_gather(self.packed, self.shard)
        else:
            self.packed.copy_(self.shard)
        flat.unpack(self.packed, flat.params)
        self.step_count.add_(1.0 if skip is None else 1.0 - skip)


class LARS(FlatOptimizer):
    """LARS on the whole flat buffer: per-tensor trust ratios, momentum with the rate inside (see the
    module docstring), ``decay_exempt`` tensors neither decayed nor adapted.

    No model-sized temporary per step: on a CPU a fresh 100 MB tensor costs page faults, which made the
    first version (segment sums of ``p * p``, rates expanded per element) 1.5x slower than a per-tensor
    loop on ResNet-50 (benchmarks/lars_flat.py). The norms come from one ``_foreach_norm`` per buffer over the tensors' views (the
    zero gaps are not in any view), the decayed gradient goes into a scratch buffer allocated once, and
    the per-tensor rates scale its views in place (``_foreach_mul_``); the rest are whole-buffer in-place
    kernels. State: the momentum buffer; the scratch (one model size) is working memory.
    """

    def __init__(self, flat: FlatParams, cfg: OptimConfig, world: int = 1, rank: int = 0,
                 decay_exempt: Sequence[bool] = ()) -> None:
        super().__init__(flat, cfg, world, rank)
        if cfg.momentum:
            self.state["momentum"] = self._zeros(flat.size)
        exempt = list(decay_exempt) or [False] * flat.num_tensors
        #: per tensor: True where LARS adapts and decays it
        self.adapt = torch.tensor([not e for e in exempt], device=flat.device)
        self.scratch = self._zeros(flat.size)  # the step (lr x local rate x decayed gradient)

        def views(buf: torch.Tensor, which: Sequence[int] = range(flat.num_tensors)) -> list[torch.Tensor]:
            return [buf[flat.offsets[i] : flat.offsets[i] + flat.numels[i]] for i in which]

        self._p, self._g, self._d = views(flat.params), views(flat.grads), views(self.scratch)
        ex = [i for i, e in enumerate(exempt) if e]
        self._g_exempt, self._d_exempt = views(flat.grads, ex), views(self.scratch, ex)

    def _update(self, p, g, lr, skip) -> None:  # noqa: ANN001
        c = self.cfg
        pn = torch.stack(torch._foreach_norm(self._p))
        gn = torch.stack(torch._foreach_norm(self._g))
        local = c.trust_coefficient * pn / (gn + c.weight_decay * pn + c.eps)
        rate = lr * torch.where((pn > 0) & (gn > 0) & self.adapt, local, torch.ones_like(pn))
        d = self.scratch
        if c.weight_decay:
            torch.add(g, p, alpha=c.weight_decay, out=d)
            if self._d_exempt:
                torch._foreach_copy_(self._d_exempt, self._g_exempt)  # exempt tensors: the plain gradient
        else:
            d.copy_(g)
        torch._foreach_mul_(self._d, list(rate.to(d.dtype).unbind()))
        if skip is None:  # in place
            if c.momentum:
                buf = self.state["momentum"]
                buf.mul_(c.momentum).add_(d)
                p.sub_(d.add_(buf, alpha=c.momentum) if c.nesterov else buf)
            else:
                p.sub_(d)
            return
        if c.momentum:
            d = _momentum_skipping(self.state["momentum"], d, c.momentum, c.nesterov, skip)
        _assign(p, p - d, skip)


class Adagrad(FlatOptimizer):
    """PyTorch Adagrad semantics: ``sum += g^2``; ``p -= lr / (1 + (t - 1) * lr_decay) * g / (sqrt(sum) + eps)``,
    L2 ``weight_decay`` added to the gradient, ``sum`` starting at ``initial_accumulator``. On rows a
    step did not touch (zero gradient) the update is exactly zero, so dense Adagrad over embedding
    tables equals torch's sparse Adagrad."""

    def __init__(self, flat: FlatParams, cfg: OptimConfig, world: int = 1, rank: int = 0) -> None:
        super().__init__(flat, cfg, world, rank)
        self.state["sum"] = torch.full((flat.size,), float(cfg.initial_accumulator), device=flat.device,
                                       dtype=flat.params.dtype)

    def _update(self, p, g, lr, skip) -> None:  # noqa: ANN001
        c = self.cfg
        if c.weight_decay:
            g = g.add(p, alpha=c.weight_decay)
        clr = lr / (1.0 + self.step_count * c.lr_decay) if c.lr_decay else lr
        acc = self.state["sum"]
        if skip is None:
            acc.addcmul_(g, g)
            p.addcdiv_(g * clr, acc.sqrt().add_(c.eps), value=-1.0)
            return
        new_acc = acc + g * g
        _assign(acc, new_acc, skip)
        _assign(p, p - clr * g / (new_acc.sqrt() + c.eps), skip)


def build_optimizer(flat: FlatParams, cfg: OptimConfig, world: int = 1, rank: int = 0,
                    allow_apex: bool = True, decay_exempt: Sequence[bool] = ()) -> FlatOptimizer:
    """The optimizer ``cfg.name`` over ``flat`` (``distributed = true`` shards LAMB's state;
    ``apex = true`` picks apex's fused LAMB where it is importable on CUDA, see common.apex_optim).
    ``decay_exempt`` (one flag per tensor of ``flat``): tensors kept out of the weight decay (and, for
    LARS and LAMB, out of the trust-ratio scaling, at any weight decay); LAMB, LARS and SGD take such a mask, so another optimizer
    with weight decay refuses one rather than ignore it.
    Parameters outside the buffer (``flat.outside``, sparse gradients) get a row-wise
    :class:`~common.sparse_optim.SparseAdagrad` that the flat Adagrad steps with the same LR and step."""
    opt = _build_flat(flat, cfg, world, rank, allow_apex, decay_exempt)
    if flat.outside:
        if world > 1 and flat.outside_shared:
            raise ConfigError(f"{len(flat.outside_shared)} parameter(s) with sparse gradients are held by every rank; "
                              "only model-parallel (rank-local) ones can be updated row-wise (no sparse all-reduce)")
        if type(opt) is not Adagrad:
            raise ConfigError(f"config key 'optim.name': the model has parameters with sparse gradients, which "
                              f"only adagrad updates (row-wise); got {cfg.name!r}")
        opt.sparse = SparseAdagrad(flat.outside, cfg, world)
    return opt


def _build_flat(flat: FlatParams, cfg: OptimConfig, world: int, rank: int, allow_apex: bool,
                decay_exempt: Sequence[bool]) -> FlatOptimizer:
    # LARS and LAMB use the mask without weight decay too: exempt tensors also skip the trust ratio
    exempt = any(decay_exempt) and (cfg.weight_decay != 0 or cfg.name in ("lars", "lamb"))
    if exempt and cfg.name not in ("lamb", "lars", "sgd"):
        names = [n for n, e in zip(flat.names, decay_exempt) if e][:3]
        raise ConfigError(f"config key 'optim.weight_decay': the workload exempts tensors ({', '.join(names)}, ...) "
                          f"from weight decay, which only the lamb, lars and sgd optimizers implement; got {cfg.name!r}")
    if exempt and len(decay_exempt) != flat.num_tensors:
        raise ConfigError(f"{len(decay_exempt)} weight-decay flags for {flat.num_tensors} parameter tensors")
    mask: Sequence[bool] = decay_exempt if exempt else ()
    if cfg.name == "lamb" and cfg.apex and not cfg.distributed and allow_apex:
        from .apex_optim import ApexLAMB, apex_lamb_available

        ok, why = apex_lamb_available(flat.device)
        if ok and exempt and not cfg.weight_decay:
            ok, why = False, "apex's LAMB cannot exempt tensors from the trust ratio at weight decay 0"
        if ok:
            return ApexLAMB(flat, cfg, world, rank, decay_exempt=mask)
        if rank == 0:
            print(f"hpcbench: optim.apex requested but not used: {why}; using the built-in LAMB", flush=True)
    if cfg.distributed and cfg.name == "lars":
        raise ConfigError("config key 'optim.distributed': only the lamb optimizer shards its state, not lars "
                          "(set it to false)")
    if cfg.name == "sgd":
        return SGD(flat, cfg, world, rank, mask)
    if cfg.name == "lars":
        return LARS(flat, cfg, world, rank, mask)
    if cfg.name in ("adam", "adamw"):
        return Adam(flat, cfg, world, rank, decoupled=cfg.name == "adamw")
    if cfg.name == "adagrad":
        return Adagrad(flat, cfg, world, rank)
    if cfg.name == "lamb":
        if cfg.distributed and flat.has_local:
            raise ConfigError("config key 'optim.distributed': the sharded LAMB splits the whole flat buffer over "
                              "the ranks, which cannot hold a model-parallel part; set it to false")
        return (DistributedLAMB if cfg.distributed else LAMB)(flat, cfg, world, rank, mask)
    raise ConfigError(f"config key 'optim.name': unknown optimizer {cfg.name!r}")
