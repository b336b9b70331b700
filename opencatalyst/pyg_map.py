"""Weight mapping from torch_geometric's ``DimeNetPlusPlus`` to :class:`hpcbench.workloads.opencatalyst.model.DimeNetPP`.

Works on a state dict, so this module does not import torch_geometric. The parameter names are also
the MLPerf reference's (``DimeNetPlusPlusWrap``), whose output blocks' ``lin_up.bias`` is taken when
present; torch_geometric's output blocks have none, mapped as zeros.
"""
from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import Tensor

from .model import DimeNetPP, DimeNetPPConfig


def config_from_pyg(pyg_model: torch.nn.Module) -> DimeNetPPConfig:
    blk = pyg_model.interaction_blocks[0]
    out = pyg_model.output_blocks[0]
    return DimeNetPPConfig(
        hidden=blk.lin_ji.in_features, out_emb=out.lin_up.out_features, int_emb=blk.lin_down.out_features,
        basis_emb=blk.lin_rbf1.out_features, blocks=len(pyg_model.interaction_blocks),
        num_spherical=pyg_model.sbf.num_spherical, num_radial=pyg_model.sbf.num_radial,
        cutoff=float(pyg_model.cutoff), envelope_exponent=pyg_model.rbf.envelope.p - 1,
        num_before_skip=len(blk.layers_before_skip), num_after_skip=len(blk.layers_after_skip),
        num_output_layers=len(out.lins))


def map_state_dict(src: Mapping[str, Tensor], cfg: DimeNetPPConfig) -> dict[str, Tensor]:
    """PyG parameter names/layouts -> this model's (fused/stacked) parameters."""
    s = {k: v.detach().clone() for k, v in src.items()}
    out: dict[str, Tensor] = {
        "rbf.freq": s["rbf.freq"], "emb.weight": s["emb.emb.weight"],
        "emb_rbf.weight": s["emb.lin_rbf.weight"], "emb_rbf.bias": s["emb.lin_rbf.bias"],
        "emb_lin.weight": s["emb.lin.weight"], "emb_lin.bias": s["emb.lin.bias"],
    }
    for b in range(cfg.blocks):
        p, q = f"interaction_blocks.{b}.", f"blocks.{b}."
        out[q + "rbf1"] = s[p + "lin_rbf1.weight"]
        out[q + "rbf2"] = s[p + "lin_rbf2.weight"]
        out[q + "sbf1"] = s[p + "lin_sbf1.weight"]
        out[q + "sbf2.weight"] = s[p + "lin_sbf2.weight"]
        out[q + "lin_kj_ji.weight"] = torch.cat([s[p + "lin_kj.weight"], s[p + "lin_ji.weight"]])
        out[q + "lin_kj_ji.bias"] = torch.cat([s[p + "lin_kj.bias"], s[p + "lin_ji.bias"]])
        for name in ("lin_down.weight", "lin_up.weight", "lin.weight", "lin.bias"):
            out[q + name] = s[p + name]
        for ours, theirs, n in (("before", "layers_before_skip", cfg.num_before_skip),
                                ("after", "layers_after_skip", cfg.num_after_skip)):
            for i in range(n):
                for lin in ("lin1", "lin2"):
                    for t in ("weight", "bias"):
                        out[f"{q}{ours}.{i}.{lin}.{t}"] = s[f"{p}{theirs}.{i}.{lin}.{t}"]
    k = range(cfg.blocks + 1)
    o = "output_blocks.{}."
    out["out.rbf"] = torch.stack([s[o.format(i) + "lin_rbf.weight"] for i in k])
    out["out.up"] = torch.stack([s[o.format(i) + "lin_up.weight"].t() for i in k])
    # torch_geometric's lin_up has no bias (the reference's has one): a missing bias maps to zeros
    out["out.up_b"] = torch.stack([s.get(o.format(i) + "lin_up.bias", torch.zeros(cfg.out_emb))[None] for i in k])
    out["out.w"] = torch.stack([torch.stack([s[o.format(i) + f"lins.{l}.weight"].t() for i in k])
                                for l in range(cfg.num_output_layers)])
    out["out.b"] = torch.stack([torch.stack([s[o.format(i) + f"lins.{l}.bias"][None] for i in k])
                                for l in range(cfg.num_output_layers)])
    out["out.final"] = torch.stack([s[o.format(i) + "lin.weight"].t() for i in k])
    return {key: v.contiguous() for key, v in out.items()}


def from_pyg(pyg_model: torch.nn.Module) -> DimeNetPP:
    cfg = config_from_pyg(pyg_model)
    model = DimeNetPP(cfg)
    model.load_state_dict(map_state_dict(pyg_model.state_dict(), cfg), strict=True)
    return model
