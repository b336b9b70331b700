"""OpenFold model: the closed parameter count, residue geometry, a mini model's forward/backward and one
training step, recycling without gradients, chunking, bf16, and named errors for bad feature dicts."""
from __future__ import annotations

import math
import re
from dataclasses import replace
from importlib import resources

import numpy as np
import pytest
import torch

from hpcbench.workloads.openfold_mlperf import residue_constants as rc
from hpcbench.workloads.openfold_mlperf.model.alphafold import AlphaFold, FeatureError
from hpcbench.workloads.openfold_mlperf.model.config import ModelConfig
from hpcbench.workloads.openfold_mlperf.model.losses import alphafold_loss
from hpcbench.workloads.openfold_mlperf.model.rigid import Rigid, quat_to_rot
from hpcbench.workloads.openfold_mlperf.model.structure import frames_to_atom14, torsion_angles_to_frames

from openfold_model_feats import feature_dict, last_iteration


def _closed_yaml_parameter_count() -> int:
    text = (resources.files("mlperf_logging") / "compliance_checker" / "hpc_3.0.0" / "closed_openfold.yaml").read_text()
    block = text[text.index("model_parameters_count"):]
    return int(re.search(r"v\['value'\] == (\d+)", block).group(1))


def test_closed_parameter_count_equals_closed_yaml() -> None:
    with torch.device("meta"):
        model = AlphaFold(ModelConfig.closed())
    assert sum(p.numel() for p in model.parameters()) == _closed_yaml_parameter_count() == 93_229_082


def test_residue_tables() -> None:
    heavy = {"GLY": 4, "ALA": 5, "SER": 6, "TRP": 14, "TYR": 12, "ARG": 11}
    for name, n in heavy.items():
        r = rc.RESTYPE_ORDER[rc.RESTYPE_3TO1[name]]
        assert rc.RESTYPE_ATOM14_MASK[r].sum() == n == rc.RESTYPE_ATOM37_MASK[r].sum()
        # atom14 <-> atom37 maps are inverse on the residue's atoms
        for slot in range(n):
            assert rc.RESTYPE_ATOM37_TO_ATOM14[r, rc.RESTYPE_ATOM14_TO_ATOM37[r, slot]] == slot
    assert rc.ATOM_TYPE_NUM == 37 and rc.ATOM_ORDER["CA"] == 1 and rc.ATOM_ORDER["CB"] == 3
    assert rc.RESTYPE_ATOM14_MASK[rc.UNK_RESTYPE_INDEX].sum() == 0
    # ideal bond lengths N-CA ~1.46 A, CA-C ~1.52 A in the backbone group of every residue
    for r in range(20):
        pos = rc.RESTYPE_ATOM14_RIGID_GROUP_POSITIONS[r]
        assert 1.44 < np.linalg.norm(pos[0] - pos[1]) < 1.48 and 1.51 < np.linalg.norm(pos[2] - pos[1]) < 1.54
    # default frames are rigid (orthonormal rotation, det +1) wherever the group exists
    for r in range(20):
        for g in np.flatnonzero(rc.RESTYPE_RIGID_GROUP_EXISTS[r]):
            m = rc.RESTYPE_RIGID_GROUP_DEFAULT_FRAME[r, g, :3, :3]
            assert np.allclose(m @ m.T, np.eye(3), atol=1e-5) and abs(np.linalg.det(m) - 1) < 1e-5
    asp = rc.RESTYPE_ORDER["D"]
    od1, od2 = rc.RESTYPE_NAME_TO_ATOM14_NAMES["ASP"].index("OD1"), rc.RESTYPE_NAME_TO_ATOM14_NAMES["ASP"].index("OD2")
    assert rc.RESTYPE_ATOM14_AMBIGUOUS_ATOMS_SWAP_IDX[asp, od1] == od2 and rc.CHI_PI_PERIODIC[asp][1] == 1.0


def _dihedral(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
    b0, b1, b2 = a - b, c - b, d - c
    b1 = b1 / b1.norm(dim=-1, keepdim=True)
    v = b0 - (b0 * b1).sum(-1, keepdim=True) * b1
    w = b2 - (b2 * b1).sum(-1, keepdim=True) * b1
    x = (v * w).sum(-1)
    y = (torch.cross(b1, v, dim=-1) * w).sum(-1)
    return torch.atan2(y, x)


def test_torsions_to_atoms_reproduce_chi_angles() -> None:
    """Atoms placed from the default frames and chi angles have exactly those chi dihedrals: the geometry
    tables and Algorithm 24 agree with the chi-angle atom definitions."""
    gen = torch.Generator().manual_seed(3)
    aatype = torch.arange(20)
    chis = (torch.rand(20, 4, generator=gen) * 2 - 1) * math.pi
    ang = torch.zeros(20, 7, 2)
    ang[..., 1] = 1.0
    ang[:, 3:, 0], ang[:, 3:, 1] = torch.sin(chis), torch.cos(chis)
    q = torch.randn(20, 4, generator=gen)
    bb = Rigid(quat_to_rot(q / q.norm(dim=-1, keepdim=True)), torch.randn(20, 3, generator=gen) * 10)
    frames = torsion_angles_to_frames(bb, ang, aatype, torch.tensor(rc.RESTYPE_RIGID_GROUP_DEFAULT_FRAME))
    pos14 = frames_to_atom14(Rigid(frames.rot[None], frames.trans[None]), aatype[None],
                             torch.tensor(rc.RESTYPE_ATOM14_TO_RIGID_GROUP), torch.tensor(rc.RESTYPE_ATOM14_MASK),
                             torch.tensor(rc.RESTYPE_ATOM14_RIGID_GROUP_POSITIONS))[0]
    checked = 0
    for r, letter in enumerate(rc.RESTYPES):
        name = rc.RESTYPE_1TO3[letter]
        slots = rc.RESTYPE_NAME_TO_ATOM14_NAMES[name]
        for k, quad in enumerate(rc.CHI_ANGLES_ATOMS[name]):
            p = [pos14[r, slots.index(a)] for a in quad]
            got = _dihedral(*p)
            diff = torch.remainder(got - chis[r, k] + math.pi, 2 * math.pi) - math.pi
            assert abs(float(diff)) < 1e-3, (name, k, float(got), float(chis[r, k]))
            checked += 1
    assert checked == int(np.asarray(rc.CHI_ANGLES_MASK).sum())


def _mini() -> tuple[ModelConfig, AlphaFold]:
    torch.manual_seed(0)
    cfg = ModelConfig.mini()
    return cfg, AlphaFold(cfg)


def test_mini_forward_backward_and_one_training_step() -> None:
    cfg, model = _mini()
    batch = feature_dict(n_res=32, n_clust=6, n_extra=8, n_templ=2, n_cycle=2, batch=1)
    out = model(batch)
    r = 32
    assert out["sm_positions"].shape == (1, cfg.structure.num_blocks, r, 14, 3)
    assert out["final_atom_positions"].shape == (1, r, 37, 3)
    assert out["distogram_logits"].shape == (1, r, r, 64)
    assert out["masked_msa_logits"].shape == (1, 6, r, 23)
    assert out["lddt_logits"].shape == (1, r, 50) and out["plddt"].shape == (1, r)
    assert torch.allclose(out["distogram_logits"], out["distogram_logits"].transpose(1, 2))
    loss, report = alphafold_loss(out, last_iteration(batch), cfg.loss)
    assert torch.isfinite(loss) and float(report["nonfinite_terms"]) == 0.0
    before = {k: v.detach().clone() for k, v in model.named_parameters()}
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.0)
    opt.zero_grad()
    loss.backward()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert len(grads) > 0.9 * len(list(model.parameters()))
    assert all(torch.isfinite(g).all() for g in grads)
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 0.1)
    assert torch.isfinite(norm)
    opt.step()
    changed = {k for k, p in model.named_parameters() if not torch.equal(before[k], p.detach())}
    # AlphaFold's zero-initialised output layers take the first step (the branches behind them have no
    # gradient until those layers are non-zero)
    assert {"structure_module.bb_update.linear.weight", "auxiliary_heads.distogram.linear.weight",
            "auxiliary_heads.masked_msa.linear.weight", "auxiliary_heads.plddt.linear_3.weight"} <= changed
    # the same sample scores a lower loss after a few steps, and by then nearly every parameter has moved
    for _ in range(4):
        opt.zero_grad()
        loss2, _ = alphafold_loss(model(batch), last_iteration(batch), cfg.loss)
        loss2.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.1)
        opt.step()
    assert float(loss2.detach()) < float(loss.detach())
    moved = sum(not torch.equal(before[k], p.detach()) for k, p in model.named_parameters())
    assert moved > 0.9 * len(before)


def test_recycling_iterations_run_without_gradients() -> None:
    cfg, model = _mini()
    seen: list[tuple[bool, bool]] = []
    original = model.recycling_embedder.forward

    def spy(m0, z, x):
        seen.append((torch.is_grad_enabled(), z.requires_grad))
        return original(m0, z, x)

    model.recycling_embedder.forward = spy
    model(feature_dict(n_res=16, n_cycle=3))
    assert seen == [(False, False), (False, False), (True, False)]


def test_activation_checkpointing_off_gives_the_same_loss_and_gradients() -> None:
    """``activation_checkpointing = False`` (the mini preset) keeps the blocks' activations instead of
    recomputing them in the backward pass: the same loss and the same gradients, and the checkpointed model
    really recomputes (its Evoformer blocks run twice per training step, the other's once)."""
    cfg, model = _mini()
    plain = AlphaFold(replace(cfg, activation_checkpointing=False))
    with torch.no_grad():  # non-zero final layers: every block's gradient is non-zero
        for p in model.parameters():
            p.add_(0.01 * torch.randn_like(p))
    plain.load_state_dict(model.state_dict())
    batch = feature_dict(n_res=16, n_clust=6, n_extra=8, n_templ=2, n_cycle=2, batch=1)
    losses, grads, calls = [], [], []
    for m in (model, plain):
        m.train()
        runs = [0]
        m.evoformer_stack.blocks[0].register_forward_pre_hook(lambda *_: runs.__setitem__(0, runs[0] + 1))
        torch.manual_seed(1)  # the same dropout masks (the recomputation replays the RNG state)
        loss, _ = alphafold_loss(m(batch), last_iteration(batch), cfg.loss)
        loss.backward()
        losses.append(loss.detach())
        grads.append({k: p.grad for k, p in m.named_parameters() if p.grad is not None})
        calls.append(runs[0])
    assert calls == [3, 2]  # no-grad recycling pass + training pass (+ its recomputation when checkpointed)
    assert torch.equal(losses[0], losses[1])
    assert grads[0].keys() == grads[1].keys() and len(grads[0]) > 0.9 * len(list(model.parameters()))
    for k, g in grads[0].items():
        assert torch.allclose(g, grads[1][k], rtol=1e-5, atol=1e-7), k


def test_template_pair_stack_runs_once_where_its_inputs_do_not_change() -> None:
    """Where the template features and residue mask are the same in every recycling iteration and no dropout
    draws masks (evaluation, or dropout 0), the template pair stack runs once and the recycling iterations
    read its output: the same outputs, loss and gradients as running it in every iteration. Templates that
    differ between iterations, or training with template dropout, run it in every iteration."""
    cfg, _ = _mini()  # no dropout anywhere (the mini preset's model.dropout = false): no random masks
    cfg = replace(cfg, template=replace(cfg.template, dropout_rate=0.0),
                  evoformer=replace(cfg.evoformer, msa_dropout=0.0, pair_dropout=0.0),
                  extra_msa=replace(cfg.extra_msa, msa_dropout=0.0, pair_dropout=0.0),
                  structure=replace(cfg.structure, dropout_rate=0.0))
    torch.manual_seed(0)
    model = AlphaFold(cfg)
    with torch.no_grad():  # non-zero final layers: the template branch reaches every output
        for p in model.parameters():
            p.add_(0.01 * torch.randn_like(p))
    runs = [0]
    model.template_pair_stack.register_forward_pre_hook(lambda *_: runs.__setitem__(0, runs[0] + 1))
    batch = feature_dict(n_res=16, n_clust=6, n_extra=8, n_templ=2, n_cycle=3, batch=1)

    def step(reuse: bool) -> tuple[int, torch.Tensor, dict[str, torch.Tensor]]:
        runs[0] = 0
        model.zero_grad(set_to_none=True)
        model._template_pairs_constant = (lambda *a: AlphaFold._template_pairs_constant(model, *a)) if reuse \
            else (lambda *a: False)
        model.train()
        loss, _ = alphafold_loss(model(batch), last_iteration(batch), cfg.loss)
        loss.backward()
        return runs[0], loss.detach(), {k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None}

    once, loss_once, grads_once = step(True)
    every, loss_every, grads_every = step(False)
    assert (once, every) == (1, 3)
    assert torch.equal(loss_once, loss_every)
    assert grads_once.keys() == grads_every.keys() and any("template_pair_stack" in k for k in grads_once)
    for k, g in grads_once.items():
        assert torch.allclose(g, grads_every[k], rtol=1e-5, atol=1e-7), k
    del model._template_pairs_constant
    model.eval()
    runs[0] = 0
    with torch.no_grad():
        model(batch)
    assert runs[0] == 1
    changed = dict(batch)  # a template that differs in the first iteration: the stack runs in each
    changed["template_pseudo_beta"] = batch["template_pseudo_beta"].clone()
    changed["template_pseudo_beta"][..., 0] += 1.0
    runs[0] = 0
    with torch.no_grad():
        model(changed)
    assert runs[0] == 3
    dropout = AlphaFold(ModelConfig.mini()).train()  # the reference's template dropout: every iteration draws
    assert dropout.cfg.template.dropout_rate > 0
    calls = [0]
    dropout.template_pair_stack.register_forward_pre_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    dropout(batch)
    assert calls[0] == 3


def test_chunked_equals_unchunked() -> None:
    cfg, model = _mini()
    model.eval()
    chunked = AlphaFold(cfg.with_chunks(5)).eval()
    chunked.load_state_dict(model.state_dict())
    # make the final layers non-zero so that outputs depend on every block
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.01 * torch.randn_like(p))
        chunked.load_state_dict(model.state_dict())
    batch = feature_dict(n_res=16, n_cycle=2)
    with torch.no_grad():
        a, b = model(batch), chunked(batch)
    for k in ("final_atom_positions", "distogram_logits", "masked_msa_logits", "lddt_logits"):
        assert torch.allclose(a[k], b[k], atol=1e-4, rtol=1e-4), k


def test_bf16_forward_is_finite() -> None:
    cfg, model = _mini()
    batch = feature_dict(n_res=16, n_cycle=2)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(batch)
        loss, _ = alphafold_loss(out, last_iteration(batch), cfg.loss)
    assert torch.isfinite(loss)
    model_bf16 = AlphaFold(cfg).to(torch.bfloat16)
    fb = {k: (v.to(torch.bfloat16) if v.is_floating_point() else v) for k, v in batch.items()}
    out = model_bf16(fb)
    assert out["final_atom_positions"].dtype == torch.bfloat16
    assert all(torch.isfinite(out[k].float()).all() for k in ("final_atom_positions", "distogram_logits", "plddt"))


def test_bad_feature_dicts_are_named() -> None:
    cfg, model = _mini()
    batch = feature_dict(n_res=12, n_cycle=2)
    no_msa = {k: v for k, v in batch.items() if k != "msa_feat"}
    with pytest.raises(FeatureError, match="missing msa_feat"):
        model(no_msa)
    short = dict(batch, extra_msa_mask=batch["extra_msa_mask"][..., :1])
    with pytest.raises(FeatureError, match=r"'extra_msa_mask'.*recycling 2 last"):
        model(short)
    bad_dim = dict(batch, target_feat=batch["target_feat"][:, :, :21])
    with pytest.raises(FeatureError, match=r"'target_feat': shape \(1, 12, 21, 2\), expected \(1, 12, 22, 2\)"):
        model(bad_dim)
    nan = dict(batch, template_all_atom_positions=batch["template_all_atom_positions"] * float("nan"))
    with pytest.raises(FeatureError, match="'template_all_atom_positions': holds non-finite"):
        model(nan)
    aa = batch["aatype"].clone()
    aa[0, 0] = 25
    with pytest.raises(FeatureError, match=r"'aatype': values 0\.\.25, expected 0\.\.20"):
        model(dict(batch, aatype=aa))
