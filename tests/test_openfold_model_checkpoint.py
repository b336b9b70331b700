"""The pinned start: a checkpoint in the MLPerf HPC openfold reference's layout (names and shapes of its
``AlphaFold`` module tree, written out below from the reference's modules, not from ours) loads onto our
model; bad files are refused by name; a closed run refuses a checkpoint whose sha256 differs."""
from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
import torch

from hpcbench.workloads.openfold_mlperf.model.alphafold import AlphaFold
from hpcbench.workloads.openfold_mlperf.model.checkpoint import (CLOSED_INIT_CHECKPOINT_SHA256, CheckpointError,
                                                                 load_initial_checkpoint, load_optimizer_state,
                                                                 sha256_file)
from hpcbench.workloads.openfold_mlperf.model.config import ModelConfig


def reference_layout(cfg: ModelConfig) -> list[tuple[str, tuple[int, ...]]]:
    """(name, shape) of every parameter of the reference's ``openfold.model.alphafold.AlphaFold``, in its
    registration order, transcribed from the reference's module ``__init__``s (mlcommons/hpc openfold)."""
    out: list[tuple[str, tuple[int, ...]]] = []

    def lin(name: str, c_out: int, c_in: int, bias: bool = True) -> None:
        out.append((f"{name}.weight", (c_out, c_in)))
        if bias:
            out.append((f"{name}.bias", (c_out,)))

    def ln(name: str, c: int) -> None:
        out.extend([(f"{name}.weight", (c,)), (f"{name}.bias", (c,))])

    def gated_mha(name: str, c: int, c_hidden: int, heads: int) -> None:  # SelfAttentionWithGate
        for x in "qkv":
            lin(f"{name}.linear_{x}", heads * c_hidden, c, bias=False)
        lin(f"{name}.linear_o", c, heads * c_hidden)
        lin(f"{name}.linear_g", heads * c_hidden, c)

    def tri_att(name: str, c: int, c_hidden: int, heads: int) -> None:
        ln(f"{name}.layer_norm", c)
        lin(f"{name}.linear", heads, c, bias=False)
        gated_mha(f"{name}.mha", c, c_hidden, heads)

    def tri_mul(name: str, c: int, c_hidden: int) -> None:
        for x in ("a_p", "a_g", "b_p", "b_g"):
            lin(f"{name}.linear_{x}", c_hidden, c)
        lin(f"{name}.linear_g", c, c)
        lin(f"{name}.linear_z", c, c_hidden)
        ln(f"{name}.layer_norm_in", c)
        ln(f"{name}.layer_norm_out", c_hidden)

    def transition(name: str, c: int, n: int) -> None:
        ln(f"{name}.layer_norm", c)
        lin(f"{name}.linear_1", n * c, c)
        lin(f"{name}.linear_2", c, n * c)

    def core(name: str, c_m: int, e) -> None:  # EvoformerBlockCore
        transition(f"{name}.msa_transition", c_m, e.transition_n)
        ln(f"{name}.outer_product_mean.layer_norm", c_m)
        lin(f"{name}.outer_product_mean.linear_1", e.c_hidden_opm, c_m)
        lin(f"{name}.outer_product_mean.linear_2", e.c_hidden_opm, c_m)
        lin(f"{name}.outer_product_mean.linear_out", e.c_z, e.c_hidden_opm ** 2)
        tri_mul(f"{name}.tri_mul_out", e.c_z, e.c_hidden_tri_mul)
        tri_mul(f"{name}.tri_mul_in", e.c_z, e.c_hidden_tri_mul)
        tri_att(f"{name}.tri_att_start", e.c_z, e.c_hidden_tri_att, e.num_heads_tri)
        tri_att(f"{name}.tri_att_end", e.c_z, e.c_hidden_tri_att, e.num_heads_tri)
        transition(f"{name}.pair_transition", e.c_z, e.transition_n)

    def msa_row(name: str, c_m: int, e) -> None:  # MSARowAttentionWithPairBias
        ln(f"{name}.layer_norm_m", c_m)
        ln(f"{name}.layer_norm_z", e.c_z)
        lin(f"{name}.linear_z", e.num_heads_msa, e.c_z, bias=False)
        gated_mha(f"{name}.mha", c_m, e.c_hidden_msa_att, e.num_heads_msa)

    c_m, c_z, c_s, t = cfg.c_m, cfg.c_z, cfg.c_s, cfg.template
    for x, c_o, c_i in (("tf_z_i", c_z, cfg.tf_dim), ("tf_z_j", c_z, cfg.tf_dim), ("tf_m", c_m, cfg.tf_dim),
                        ("msa_m", c_m, cfg.msa_dim), ("relpos", c_z, 2 * cfg.relpos_k + 1)):
        lin(f"input_embedder.linear_{x}", c_o, c_i)
    lin("recycling_embedder.linear", c_z, cfg.recycle_num_bins)
    ln("recycling_embedder.layer_norm_m", c_m)
    ln("recycling_embedder.layer_norm_z", c_z)
    lin("template_angle_embedder.linear_1", c_m, t.ta_dim)
    lin("template_angle_embedder.linear_2", c_m, c_m)
    lin("template_pair_embedder.linear", t.c_t, t.tp_dim)
    for i in range(t.num_blocks):
        p = f"template_pair_stack.blocks.{i}"
        tri_att(f"{p}.tri_att_start", t.c_t, t.c_hidden_tri_att, t.num_heads_tri)
        tri_att(f"{p}.tri_att_end", t.c_t, t.c_hidden_tri_att, t.num_heads_tri)
        tri_mul(f"{p}.tri_mul_out", t.c_t, t.c_hidden_tri_mul)
        tri_mul(f"{p}.tri_mul_in", t.c_t, t.c_hidden_tri_mul)
        transition(f"{p}.pair_transition", t.c_t, t.pair_transition_n)
    ln("template_pair_stack.layer_norm", t.c_t)
    hc = t.num_heads_pointwise * t.c_hidden_pointwise
    lin("template_pointwise_attention.mha.linear_q", hc, c_z, bias=False)
    lin("template_pointwise_attention.mha.linear_k", hc, t.c_t, bias=False)
    lin("template_pointwise_attention.mha.linear_v", hc, t.c_t, bias=False)
    lin("template_pointwise_attention.mha.linear_o", c_z, hc)
    e = cfg.extra_msa
    lin("extra_msa_embedder.linear", cfg.c_e, cfg.emsa_dim)
    for i in range(e.num_blocks):
        p = f"extra_msa_stack.blocks.{i}"
        msa_row(f"{p}.msa_att_row", cfg.c_e, e)
        ln(f"{p}.msa_att_col.layer_norm_m", cfg.c_e)
        g = f"{p}.msa_att_col.global_attention"
        lin(f"{g}.linear_q", e.num_heads_msa * e.c_hidden_msa_att, cfg.c_e, bias=False)
        lin(f"{g}.linear_k", e.c_hidden_msa_att, cfg.c_e, bias=False)
        lin(f"{g}.linear_v", e.c_hidden_msa_att, cfg.c_e, bias=False)
        lin(f"{g}.linear_g", e.num_heads_msa * e.c_hidden_msa_att, cfg.c_e)
        lin(f"{g}.linear_o", cfg.c_e, e.num_heads_msa * e.c_hidden_msa_att)
        core(f"{p}.core", cfg.c_e, e)
    e = cfg.evoformer
    for i in range(e.num_blocks):
        p = f"evoformer_stack.blocks.{i}"
        msa_row(f"{p}.msa_att_row", c_m, e)
        ln(f"{p}.msa_att_col.layer_norm_m", c_m)
        gated_mha(f"{p}.msa_att_col.mha", c_m, e.c_hidden_msa_att, e.num_heads_msa)
        core(f"{p}.core", c_m, e)
    lin("evoformer_stack.linear", c_s, c_m)
    s = cfg.structure
    ln("structure_module.layer_norm_s", c_s)
    ln("structure_module.layer_norm_z", c_z)
    lin("structure_module.linear_in", c_s, c_s)
    h = s.num_heads_ipa
    out.append(("structure_module.ipa.head_weights", (h,)))  # a module's own parameters precede its children's
    lin("structure_module.ipa.linear_q", h * s.c_hidden_ipa, c_s)
    lin("structure_module.ipa.linear_kv", 2 * h * s.c_hidden_ipa, c_s)
    lin("structure_module.ipa.linear_q_points", h * s.num_qk_points * 3, c_s)
    lin("structure_module.ipa.linear_kv_points", h * (s.num_qk_points + s.num_v_points) * 3, c_s)
    lin("structure_module.ipa.linear_b", h, c_z)
    lin("structure_module.ipa.linear_out", c_s, h * (c_z + s.c_hidden_ipa + 4 * s.num_v_points))
    ln("structure_module.layer_norm_ipa", c_s)
    for j in (1, 2, 3):
        lin(f"structure_module.transition.linear_{j}", c_s, c_s)
    ln("structure_module.transition.layer_norm", c_s)
    lin("structure_module.bb_update.linear", 6, c_s)
    lin("structure_module.angle_resnet.linear_in", s.c_hidden_ang_res, c_s)
    lin("structure_module.angle_resnet.linear_initial", s.c_hidden_ang_res, c_s)
    for j in range(s.num_ang_res_blocks):
        lin(f"structure_module.angle_resnet.layers.{j}.linear_1", s.c_hidden_ang_res, s.c_hidden_ang_res)
        lin(f"structure_module.angle_resnet.layers.{j}.linear_2", s.c_hidden_ang_res, s.c_hidden_ang_res)
    lin("structure_module.angle_resnet.linear_out", 2 * s.num_angles, s.c_hidden_ang_res)
    hd = cfg.heads
    ln("auxiliary_heads.plddt.layer_norm", c_s)
    lin("auxiliary_heads.plddt.linear_1", hd.c_hidden_plddt, c_s)
    lin("auxiliary_heads.plddt.linear_2", hd.c_hidden_plddt, hd.c_hidden_plddt)
    lin("auxiliary_heads.plddt.linear_3", hd.plddt_bins, hd.c_hidden_plddt)
    lin("auxiliary_heads.distogram.linear", hd.distogram_bins, c_z)
    lin("auxiliary_heads.masked_msa.linear", hd.masked_msa_classes, c_m)
    lin("auxiliary_heads.experimentally_resolved.linear", hd.experimentally_resolved_classes, c_s)
    return out


def _reference_checkpoint(cfg: ModelConfig, path: Path, seed: int = 1, resumable: bool = True
                          ) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    sd = {name: torch.randn(shape, generator=gen) for name, shape in reference_layout(cfg)}
    if resumable:  # the reference's save_checkpoint: iteration, model and Adam state
        params = [torch.nn.Parameter(v.clone()) for v in sd.values()]
        opt = torch.optim.Adam(params, lr=1e-3, eps=1e-6)
        sum((p ** 2).sum() for p in params).backward()
        opt.step()
        torch.save({"iteration": 0, "alphafold_state_dict": sd, "optimizer_state_dict": opt.state_dict()}, path)
    else:
        torch.save(sd, path)
    return sd


def test_closed_layout_equals_reference_tree() -> None:
    cfg = ModelConfig.closed()
    with torch.device("meta"):
        model = AlphaFold(cfg)
    ours = [(k, tuple(v.shape)) for k, v in model.state_dict().items()]
    ref = reference_layout(cfg)
    assert len(ref) == 5044
    assert ours == ref  # names, shapes and order (the Adam state is positional)
    assert sum(int(torch.Size(s).numel()) for _, s in ref) == 93_229_082


@pytest.mark.parametrize("resumable", [True, False])
def test_reference_checkpoint_loads(tmp_path: Path, resumable: bool) -> None:
    cfg = ModelConfig.mini()
    path = tmp_path / "mlperf_hpc_openfold_resumable_checkpoint.pt"
    sd = _reference_checkpoint(cfg, path, resumable=resumable)
    model = AlphaFold(cfg)
    info = load_initial_checkpoint(path, model)
    assert info.sha256 == hashlib.sha256(path.read_bytes()).hexdigest() == sha256_file(path)
    got = model.state_dict()
    assert all(torch.equal(got[k], v) for k, v in sd.items())
    if resumable:
        assert info.iteration == 0 and info.optimizer_state_dict is not None
        opt = torch.optim.Adam(model.parameters(), lr=1e-3, eps=1e-6)
        load_optimizer_state(opt, info.optimizer_state_dict, str(path))
        first = next(iter(opt.state.values()))
        assert first["exp_avg"].abs().sum() > 0
    else:
        assert info.iteration is None and info.optimizer_state_dict is None


def test_closed_run_refuses_other_checkpoint(tmp_path: Path) -> None:
    cfg = ModelConfig.mini()
    path = tmp_path / "ckpt.pt"
    _reference_checkpoint(cfg, path, resumable=False)
    model = AlphaFold(cfg)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(CheckpointError, match=r"sha256 [0-9a-f]{64}, expected b518be46"):
        load_initial_checkpoint(path, model, expected_sha256=CLOSED_INIT_CHECKPOINT_SHA256)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())  # untouched


def test_bad_checkpoints_are_named(tmp_path: Path) -> None:
    cfg = ModelConfig.mini()
    model = AlphaFold(cfg)
    sd = {name: torch.zeros(shape) for name, shape in reference_layout(cfg)}
    cases = {
        "missing": ({k: v for k, v in sd.items() if k != "structure_module.ipa.head_weights"},
                    r"1 missing \(e\.g\. structure_module\.ipa\.head_weights\)"),
        "unexpected": ({**sd, "auxiliary_heads.tm.linear.weight": torch.zeros(64, cfg.c_z)},
                       r"1 unexpected \(e\.g\. auxiliary_heads\.tm\.linear\.weight\)"),
        "shape": ({**sd, "evoformer_stack.linear.weight": torch.zeros(3, 3)},
                  r"'evoformer_stack\.linear\.weight' has shape \(3, 3\), expected"),
        "nonfinite": ({**sd, "input_embedder.linear_relpos.bias": torch.full((cfg.c_z,), float("nan"))},
                      r"'input_embedder\.linear_relpos\.bias' holds non-finite values"),
    }
    for name, (bad, pattern) in cases.items():
        path = tmp_path / f"{name}.pt"
        torch.save({"iteration": 3, "alphafold_state_dict": bad, "optimizer_state_dict": {}}, path)
        with pytest.raises(CheckpointError, match=pattern):
            load_initial_checkpoint(path, model)
    junk = tmp_path / "junk.pt"
    junk.write_bytes(b"not a checkpoint")
    with pytest.raises(CheckpointError, match=r"junk\.pt: not a readable torch checkpoint"):
        load_initial_checkpoint(junk, model)
    with pytest.raises(CheckpointError, match=r"absent\.pt: cannot read"):
        load_initial_checkpoint(tmp_path / "absent.pt", model)
