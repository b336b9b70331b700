"""DimeNet++ for OC20 S2EF (energy; forces = -dE/dpos by autograd), with fused small GEMMs.

The maths of the MLPerf HPC reference (mlcommons/hpc ``open_catalyst/ocpmodels/models/
dimenet_plus_plus.py``, ``DimeNetPlusPlusWrap``), which differs from torch_geometric's
``DimeNetPlusPlus`` in two places:

* the triplet angles are computed from detached positions (``pos[idx].detach()``), so they enter the
  energy but not its gradient: the forces -dE/dpos flow through the distances only (here: the cosine
  is formed from ``vec.detach()`` and ``dist.detach()``; the spherical basis's radial part still
  depends on the differentiable distance);
* each output block's ``lin_up`` has a bias (``nn.Linear`` default init, not reset by the reference),
  where torch_geometric's has none.

Restructured for speed:

* every projection of the radial basis (3 interaction blocks x rbf1.rbf2, 4 output blocks, the
  embedding) is ONE GEMM over the edges (horizontal fusion; the bias-free rbf1/rbf2 pairs are
  composed into one matrix first);
* ``lin_kj`` and ``lin_ji`` share their input: one GEMM;
* the embedding's ``Linear(3H, H)`` over [x_i, x_j, rbf] is split so the atom parts are projected
  per atom and then gathered (N rows instead of E);
* per-edge work stays on edges: the spherical Bessel part is evaluated per edge, angles come from
  the detached edge vectors (cos only, no atan2; no gradient, as the reference), ``x_kj * rbf`` and
  ``lin_down`` run before gathering to triplets;
* the blocks' first spherical projections (42 -> 8 each, bias-free): where the C loops of triplet.py
  run (the CPU), each edge's radial part is projected per angular order first ([E, 7, 8B], one
  block-diagonal GEMM) and each triplet sums the 7 rows of its kj edge weighted by its angular basis,
  never forming [T, 42]; elsewhere (accelerators, no C compiler) [T, 42] is formed and projected by one
  GEMM over the triplets, which is the faster order for torch ops (the per-edge order would gather a
  widened [T, 7 x 8B]);
* the triplet message (gather, ``b @ w``, product, scatter) and its two derivatives are one pass each
  (triplet.py: C loops on the CPU, chunked torch ops elsewhere);
* the 4 output blocks run after the last interaction as one batched GEMM chain (bmm/baddbmm).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from .act import silu
from .basis import RadialBasis, SphericalBasis, envelope
from .edge_sum import edge_product_sum
from .triplet import basis_on_edges, triplet_basis, triplet_message


@dataclass
class DimeNetPPConfig:
    hidden: int = 192
    out_emb: int = 192
    int_emb: int = 64
    basis_emb: int = 8
    blocks: int = 3
    num_spherical: int = 7
    num_radial: int = 6
    cutoff: float = 6.0
    envelope_exponent: int = 5
    num_before_skip: int = 1
    num_after_skip: int = 2
    num_output_layers: int = 3


class _NarrowLinear(torch.autograd.Function):
    """x @ w^T for x [E, K] with few input features K (the radial basis), as ``parts`` outputs: the row blocks
    of ``w`` each give one contiguous [E, N / parts] product (the fused radial projections are used apart:
    as views of one [E, N] product, each gradient pass first had to assemble the [E, N] gradient by ``cat``).
    The backward forms g @ w as (w^T @ g^T)^T and the weight gradient as (x^T @ g)^T, the fast orientations
    on CPU when K is small (g^T @ x with K output columns is several times slower), per part, and skips the
    parts no loss reaches. It is made of differentiable ops, so second derivatives go through autograd."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, w: Tensor, parts: int) -> tuple[Tensor, ...]:
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(x, w)
        ctx.parts = parts
        return tuple(x @ wi.t() for wi in w.chunk(parts))

    @staticmethod
    def backward(ctx: Any, *gs: Tensor | None) -> tuple[Tensor | None, Tensor | None, None]:
        x, w = ctx.saved_tensors
        need_x, need_w = ctx.needs_input_grad[:2]
        gx: Tensor | None = None
        gw = []
        for wi, g in zip(w.chunk(ctx.parts), gs, strict=True):
            if need_x and g is not None:
                part = (wi.t().contiguous() @ g.t()).t()
                gx = part if gx is None else gx + part
            if need_w:
                gw.append(wi.new_zeros(wi.shape) if g is None else (x.t() @ g).t())
        return gx, torch.cat(gw) if need_w else None, None


def glorot_orthogonal_(w: Tensor, scale: float = 2.0) -> Tensor:
    """Orthogonal init rescaled to variance scale / (fan_in + fan_out)."""
    with torch.no_grad():
        nn.init.orthogonal_(w)
        w.mul_((scale / ((w.size(-2) + w.size(-1)) * w.var())).sqrt())
    return w


def _linear(n_in: int, n_out: int, bias: bool = True) -> nn.Linear:
    lin = nn.Linear(n_in, n_out, bias=bias)
    glorot_orthogonal_(lin.weight)
    if bias:
        nn.init.zeros_(lin.bias)
    return lin


class Residual(nn.Module):
    def __init__(self, h: int) -> None:
        super().__init__()
        self.lin1, self.lin2 = _linear(h, h), _linear(h, h)

    def forward(self, x: Tensor) -> Tensor:
        return x + silu(self.lin2(silu(self.lin1(x))))


class Interaction(nn.Module):
    def __init__(self, c: DimeNetPPConfig) -> None:
        super().__init__()
        h, s_r = c.hidden, c.num_spherical * c.num_radial
        self.rbf1 = nn.Parameter(glorot_orthogonal_(torch.empty(c.basis_emb, c.num_radial)))
        self.rbf2 = nn.Parameter(glorot_orthogonal_(torch.empty(h, c.basis_emb)))
        self.sbf1 = nn.Parameter(glorot_orthogonal_(torch.empty(c.basis_emb, s_r)))
        self.sbf2 = _linear(c.basis_emb, c.int_emb, bias=False)
        self.lin_kj_ji = nn.Linear(h, 2 * h)  # rows [:h] = lin_kj, [h:] = lin_ji
        glorot_orthogonal_(self.lin_kj_ji.weight[:h])
        glorot_orthogonal_(self.lin_kj_ji.weight[h:])
        nn.init.zeros_(self.lin_kj_ji.bias)
        self.lin_down = _linear(h, c.int_emb, bias=False)
        self.lin_up = _linear(c.int_emb, h, bias=False)
        self.before = nn.ModuleList(Residual(h) for _ in range(c.num_before_skip))
        self.lin = _linear(h, h)
        self.after = nn.ModuleList(Residual(h) for _ in range(c.num_after_skip))

    def forward(self, x: Tensor, rbf_h: Tensor, sbf8: Tensor, idx_kj: Tensor, idx_ji: Tensor) -> Tensor:
        x_kj, x_ji = silu(self.lin_kj_ji(x)).chunk(2, dim=-1)
        down = silu(self.lin_down(x_kj * rbf_h))  # per edge, before expanding to triplets
        agg = triplet_message(down, sbf8, self.sbf2.weight.t(), idx_kj, idx_ji)  # chunked, see triplet.py
        h = x_ji + silu(self.lin_up(agg))
        for layer in self.before:
            h = layer(h)
        h = silu(self.lin(h)) + x
        for layer in self.after:
            h = layer(h)
        return h


class OutputStack(nn.Module):
    """The blocks+1 output blocks as stacked weights, evaluated together with batched GEMMs."""

    def __init__(self, c: DimeNetPPConfig) -> None:
        super().__init__()
        k, h, o = c.blocks + 1, c.hidden, c.out_emb
        self.rbf = nn.Parameter(torch.stack([glorot_orthogonal_(torch.empty(h, c.num_radial)) for _ in range(k)]))
        self.up = nn.Parameter(torch.stack([glorot_orthogonal_(torch.empty(o, h)).t() for _ in range(k)]))  # [k, h, o]
        # lin_up's bias: the reference's Linear(h, o, bias=True) keeps torch's default init U(-1/sqrt(h), 1/sqrt(h))
        self.up_b = nn.Parameter(torch.empty(k, 1, o).uniform_(-h ** -0.5, h ** -0.5))
        self.w = nn.Parameter(torch.stack([torch.stack([glorot_orthogonal_(torch.empty(o, o)).t() for _ in range(k)])
                                           for _ in range(c.num_output_layers)]))  # [L, k, o, o] (in, out)
        self.b = nn.Parameter(torch.zeros(c.num_output_layers, k, 1, o))
        self.final = nn.Parameter(torch.zeros(k, o, 1))  # zeros init, as the reference

    def forward(self, xs: list[Tensor], rbf_out: list[Tensor], dst: Tensor, num_nodes: int) -> Tensor:
        """xs: the k stages' edge states [E, H], rbf_out their k radial projections [E, H] -> per-atom
        energy [N]. Each stage is summed to the atoms on its own (no [E, k, H] stack: only the [k, N, H]
        atom sums are stacked). The projections come as k slices of the fused projection, not as
        ``[:, i]`` of one [E, k, H] view: the backward of each such select writes a zero-filled
        [E, k, H] gradient and sums the k of them, three [E, k, H] passes per stage."""
        per_atom = torch.stack([edge_product_sum(x, r, dst, num_nodes)
                                for x, r in zip(xs, rbf_out, strict=True)])  # [k, N, H]
        y = torch.baddbmm(self.up_b, per_atom, self.up)  # [k, N, O]
        for w, b in zip(self.w, self.b):
            y = silu(torch.baddbmm(b, y, w))
        return torch.bmm(y, self.final).sum(0).squeeze(-1)


class DimeNetPP(nn.Module):
    def __init__(self, c: DimeNetPPConfig | None = None) -> None:
        super().__init__()
        c = c or DimeNetPPConfig()
        self.cfg = c
        self.rbf = RadialBasis(c.num_radial, c.cutoff, c.envelope_exponent)
        self.sbf = SphericalBasis(c.num_spherical, c.num_radial, c.envelope_exponent)
        self.emb = nn.Embedding(95, c.hidden)
        nn.init.uniform_(self.emb.weight, -3 ** 0.5, 3 ** 0.5)
        # the reference's EmbeddingBlock (torch_geometric's) resets lin_rbf with torch's default Linear init
        # (weight and bias U(-1/sqrt(R), 1/sqrt(R))), not glorot-orthogonal as its other blocks' layers
        self.emb_rbf = nn.Linear(c.num_radial, c.hidden)
        self.emb_lin = nn.Linear(3 * c.hidden, c.hidden)  # columns: [x_i | x_j | rbf]
        nn.init.kaiming_uniform_(self.emb_lin.weight, a=5 ** 0.5)
        self.blocks = nn.ModuleList(Interaction(c) for _ in range(c.blocks))
        self.out = OutputStack(c)

    def _fused_rbf_weight(self) -> Tensor:
        mats = [blk.rbf2 @ blk.rbf1 for blk in self.blocks] + list(self.out.rbf) + [self.emb_rbf.weight]
        return torch.cat(mats, dim=0)  # [(2B+2) H, R]

    def forward(self, z: Tensor, pos: Tensor, edge_index: Tensor, shift: Tensor | None, idx_kj: Tensor,
                idx_ji: Tensor, batch: Tensor, num_graphs: int) -> Tensor:
        """Energy per graph. ``shift`` [E, 3] is cell_offsets @ cell of each edge (None: no PBC)."""
        c, h, nb = self.cfg, self.cfg.hidden, self.cfg.blocks
        src, dst = edge_index[0], edge_index[1]
        vec = pos.index_select(0, dst) - pos.index_select(0, src)
        if shift is not None:
            vec = vec - shift
        dist = vec.pow(2).sum(-1).sqrt()
        x = dist / c.cutoff
        env = envelope(x, c.envelope_exponent)
        rbf = self.rbf(x, env)  # [E, R]
        # all radial projections in one GEMM
        *parts, rbf_emb = _NarrowLinear.apply(rbf, self._fused_rbf_weight(), 2 * nb + 2)  # (2B+2) x [E, H]
        rbf_blocks, rbf_out = parts[:nb], parts[nb:]
        rbf_emb = silu(rbf_emb + self.emb_rbf.bias)
        # spherical basis: radial part per edge, angle (via cos, from edge vectors) per triplet, and
        # the blocks' first sbf projections fused into one GEMM over the triplets. The angle is built
        # from detached vectors, as the reference's (its pos[idx_*].detach()): no gradient reaches pos
        # through it, only through the radial part's distances.
        s_r = c.num_spherical * c.num_radial
        rad = self.sbf.radial(x).reshape(-1, s_r)  # [E, S*R]: with the envelope (one C pass on the CPU)
        vec_d, dist_d = vec.detach(), dist.detach()
        cos = (vec_d.index_select(0, idx_ji) * vec_d.index_select(0, idx_kj)).sum(-1) / (
            dist_d.index_select(0, idx_ji) * dist_d.index_select(0, idx_kj))
        cbf = self.sbf.angular(cos)  # [T, S]
        w1 = torch.cat([blk.sbf1.t() for blk in self.blocks], 1).contiguous()  # [S*R, B*8] (in, out)
        if basis_on_edges(rad):
            # C loops: project each edge's radial part per angular order l first ([E, S, 8B], a block-diagonal
            # GEMM), then per triplet sum the S rows of its kj edge weighted by its angular basis: 7 x 8B
            # multiply-adds per triplet instead of forming [T, S*R] and projecting it (42 x 8B)
            per_l = torch.block_diag(*w1.view(c.num_spherical, c.num_radial, -1).unbind(0))  # [S*R, S*8B]
            proj = (rad @ per_l).view(rad.size(0), c.num_spherical, -1)
            sbf8 = triplet_basis(proj, cbf, idx_kj).split(c.basis_emb, dim=1)
        else:
            sbf = (rad.index_select(0, idx_kj).view(-1, c.num_spherical, c.num_radial)
                   * cbf.unsqueeze(-1)).view(-1, s_r)
            # w1 contiguous (in, out): autograd then forms the weight gradient as sbf^T @ g ([42, T] x [T, 8B]),
            # several times faster on CPU than g^T @ sbf for F.linear's layout
            sbf8 = (sbf @ w1).split(c.basis_emb, dim=1)  # B x [T, 8]
        # embedding: atom parts projected per atom, then gathered to edges
        wi, wj, wr = self.emb_lin.weight.split(h, dim=1)
        a = self.emb(z)
        xe = silu((a @ wi.t()).index_select(0, dst) + (a @ wj.t()).index_select(0, src)
                    + torch.addmm(self.emb_lin.bias, rbf_emb, wr.t()))
        states = [xe]
        for b, blk in enumerate(self.blocks):
            states.append(blk(states[-1], rbf_blocks[b], sbf8[b], idx_kj, idx_ji))
        atom_energy = self.out(states, rbf_out, dst, pos.size(0))
        return atom_energy.new_zeros(num_graphs).index_add_(0, batch, atom_energy)


def energy_and_forces(model: nn.Module, z: Tensor, pos: Tensor, edge_index: Tensor, shift: Tensor | None,
                      idx_kj: Tensor, idx_ji: Tensor, batch: Tensor, num_graphs: int,
                      create_graph: bool) -> tuple[Tensor, Tensor]:
    """Energies [G] and forces -dE/dpos [N, 3]; ``create_graph`` for training on forces."""
    with torch.enable_grad():
        pos = pos.detach().requires_grad_(True)
        energy = model(z, pos, edge_index, shift, idx_kj, idx_ji, batch, num_graphs)
        (grad,) = torch.autograd.grad(energy.sum(), pos, create_graph=create_graph)
    return energy, -grad
