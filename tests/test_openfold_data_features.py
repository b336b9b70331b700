"""OpenFold feature construction: each transform's invariants, the whole pipeline against the schema, and the
synthetic dataset (readers on its files, its structure rule beating trivial predictors)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from hpcbench.workloads.openfold_mlperf import features
from hpcbench.workloads.openfold_mlperf import residue_constants as rc
from hpcbench.workloads.openfold_mlperf.data import (a3m, dataset, geometry, hhr, mmcif, msa,
                                                     pipeline, store, synth, templates)


def _msa_feats(n_seq=40, n_res=12, seed=0):
    g = torch.Generator().manual_seed(seed)
    m = torch.randint(0, 21, (n_seq, n_res), generator=g)
    p = {"msa": m.clone(), "deletion_matrix": torch.randint(0, 3, (n_seq, n_res), generator=g).float(),
         "aatype": m[0].clone(), "between_segment_residues": torch.zeros(n_res, dtype=torch.int64)}
    p = msa.make_msa_mask(p)
    return msa.make_hhblits_profile(p)


def test_sample_msa_keeps_query_first_and_partitions_rows():
    p = _msa_feats()
    orig = p["msa"].clone()
    out = msa.sample_msa({k: v.clone() for k, v in p.items()}, 8, seed=3)
    assert out["msa"].shape[0] == 8 and out["extra_msa"].shape[0] == 32
    assert torch.equal(out["msa"][0], orig[0])
    rows = sorted(map(tuple, torch.cat([out["msa"], out["extra_msa"]]).tolist()))
    assert rows == sorted(map(tuple, orig.tolist()))
    again = msa.sample_msa({k: v.clone() for k, v in p.items()}, 8, seed=3)
    assert torch.equal(again["msa"], out["msa"])  # seeded
    other = msa.sample_msa({k: v.clone() for k, v in p.items()}, 8, seed=4)
    assert not torch.equal(other["msa"], out["msa"])


def test_masked_msa_rates_and_mask_token():
    p = _msa_feats(n_seq=400, n_res=50)
    p = msa.make_masked_msa(p, 0.1, 0.1, 0.1, 0.15, seed=11)
    pos = p["bert_mask"].bool()
    assert abs(pos.float().mean().item() - 0.15) < 0.01
    assert torch.equal(p["msa"][~pos], p["true_msa"][~pos])  # untouched outside the chosen positions
    chosen = p["msa"][pos]
    assert abs((chosen == 22).float().mean().item() - 0.7) < 0.03  # mask token with 1 - 0.1 - 0.1 - 0.1
    assert chosen.max() <= 22 and (chosen[chosen != 22] <= 20).all()  # never a gap drawn from uniform/profile


def test_clustering_profile_sums_to_one_and_assigns_nearest():
    p = _msa_feats(n_seq=30)
    p = msa.sample_msa(p, 5, seed=1)
    p = msa.nearest_neighbor_clusters(p)
    p = msa.summarize_clusters(p)
    assert torch.allclose(p["cluster_profile"].sum(-1), torch.ones(5, 12), atol=1e-4)
    # a row identical to a cluster centre goes to that centre
    p2 = {k: v.clone() for k, v in p.items()}
    p2["extra_msa"][0] = p2["msa"][3]
    assert msa.nearest_neighbor_clusters(p2)["extra_cluster_assignment"][0] == 3
    p = msa.crop_extra_msa(p, 7, seed=2)
    assert p["extra_msa"].shape[0] == 7 and p["extra_deletion_matrix"].shape[0] == 7
    p = msa.make_msa_feat(p)
    assert p["msa_feat"].shape == (5, 12, 49) and p["target_feat"].shape == (12, 22)
    assert torch.all(p["extra_deletion_value"] < 1) and torch.all(p["extra_has_deletion"] <= 1)


def _ideal_chain(seq="MAVLGEFDKYSR"):
    pos, mask = synth.structure(seq)
    return seq, pos, mask


def test_geometry_torsions_frames_and_atom14():
    seq = "A" * 12  # poly-Ala: an ideal helix, phi -57, psi -47
    pos, mask = synth.structure(seq)
    p = {"aatype": torch.tensor([rc.RESTYPE_ORDER[c] for c in seq]), "all_atom_positions": torch.from_numpy(pos),
         "all_atom_mask": torch.from_numpy(mask.astype(np.float32))}
    p = geometry.make_atom14_masks(p)
    p = geometry.make_atom14_positions(p)
    p = geometry.atom37_to_frames(p)
    p = geometry.atom37_to_torsion_angles(p)
    sc = p["torsion_angles_sin_cos"]
    phi = torch.rad2deg(torch.atan2(sc[1:, 1, 0], sc[1:, 1, 1]))
    psi = torch.rad2deg(torch.atan2(sc[:, 2, 0], sc[:, 2, 1]))
    assert torch.allclose(phi, torch.full_like(phi, -57.0), atol=0.5)
    # psi read from N-CA-C-O (O sits at psi + 180) with the reference's sign flip gives psi itself
    assert torch.allclose(psi, torch.full_like(psi, -47.0), atol=0.5)
    assert p["torsion_angles_mask"][0, 0] == 0 and p["torsion_angles_mask"][1, 0] == 1  # no pre-omega at start
    exists = p["rigidgroups_gt_exists"].bool()
    assert exists[:, [0, 3]].all() and not exists[:, 4:].any()  # Ala: backbone and psi groups only
    rot = p["rigidgroups_gt_frames"][..., :3, :3][exists]
    eye = torch.eye(3).expand_as(rot)
    assert torch.allclose(rot @ rot.transpose(-1, -2), eye, atol=1e-5)
    assert torch.allclose(torch.linalg.det(rot), torch.ones(len(rot)), atol=1e-5)
    assert torch.allclose(p["rigidgroups_gt_frames"][:, 0, :3, 3], torch.from_numpy(pos[:, 1]))  # origin CA
    assert p["atom14_gt_exists"][:, :5].all() and not p["atom14_gt_exists"][:, 5:].any()
    # renaming swaps ASP OD1/OD2 in the alternative ground truth
    d = torch.zeros(1, 37, 3)
    d[0, rc.ATOM_ORDER["OD1"]] = torch.tensor([1.0, 2.0, 3.0])
    q = geometry.make_atom14_positions(geometry.make_atom14_masks(
        {"aatype": torch.tensor([rc.RESTYPE_ORDER["D"]]), "all_atom_positions": d,
         "all_atom_mask": (d.abs().sum(-1) > 0).float()}))
    od1, od2 = rc.ATOM14_NAMES["ASP"].index("OD1"), rc.ATOM14_NAMES["ASP"].index("OD2")
    assert q["atom14_alt_gt_positions"][0, od2].tolist() == [1.0, 2.0, 3.0]
    assert q["atom14_alt_gt_exists"][0, od2] == 1 and q["atom14_alt_gt_exists"][0, od1] == 0
    assert q["atom14_atom_is_ambiguous"][0, od1] == 1


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("openfold_synth")
    synth.generate_raw(root, synth.SynthConfig(families=3, members=3, min_length=30, max_length=50, msa_rows=24))
    synth.preprocess(root)
    return root


def test_synthetic_files_read_back_with_the_readers(synthetic):
    files = sorted((synthetic / "pdb_mmcif/raw").glob("*/*.cif.gz"))
    assert len(files) == 9
    s = mmcif.read(files[0])
    seq = s.sequences["A"]
    assert set(seq) <= set(rc.RESTYPES) and s.atoms["A"].mask[:, rc.ATOM_ORDER["CA"]].all()
    chain = synthetic / "open_protein_set/original/pdb" / f"{s.pdb_id}_A"
    m = a3m.parse((chain / "a3m/bfd_uniclust_hits.a3m").read_text(), "bfd")
    assert m.sequences[0] == seq and len(m.sequences) == 9 and any(any(d) for d in m.deletions)
    hits = hhr.parse((chain / "hhr/pdb70_hits.hhr").read_text(), "hhr")
    assert len(hits) == 2 and all(h.query == seq for h in hits)
    rows = store.read_chains(synthetic / "pdb_mmcif/processed/chains.csv")
    assert len(rows) == 9 and len({r.pdb_cluster_id for r in rows}) == 3
    assert len(dataset.train_filter(rows, "2021-09-16")) == 6  # one member per family is released after


def test_pipeline_sample_matches_schema_and_recycling_resamples(synthetic):
    rows = store.read_chains(synthetic / "pdb_mmcif/processed/chains.csv")
    train = dataset.train_filter(rows, "2021-09-16")
    cfg = pipeline.PipelineConfig(crop_size=24, max_msa_clusters=8, max_extra_msa=16, num_recycling_iters=2)
    ds = dataset.ChainDataset(synthetic, train, rows, cfg, "train")
    f = ds[(0, 5)]
    features.check(f, cfg.sizes(24), train=True)
    assert torch.equal(f["aatype"][..., 0], f["aatype"][..., 2])  # one crop for every iteration
    assert not torch.equal(f["bert_mask"][..., 0], f["bert_mask"][..., 1])  # masking resampled per iteration
    assert torch.equal(f["true_msa"][0, :, 0], f["aatype"][:, 0])  # the query stays row 0
    assert int(f["template_mask"][:, 0].sum()) <= 2  # only the earlier family members, subsampled
    assert torch.equal(ds[(0, 5)]["msa_feat"], f["msa_feat"])  # (index, seed) is deterministic
    val_rows = [r for r in rows if r.release_date > "2021-09-16"]
    ev = dataset.ChainDataset(synthetic, val_rows, rows, cfg, "eval")[(0, 1)]
    n = val_rows[0].sequence_length
    features.check(ev, cfg.sizes(n), train=False)
    assert ev["template_mask"][:, 0].sum() == 2  # evaluation keeps every template (no subsampling)


def test_pipeline_crop_offsets_and_padding():
    seq, pos, mask = _ideal_chain()
    m = a3m.msa_features(seq, [("q", a3m.parse(f">q\n{seq}\n>h\n{seq[:-1]}-\n", "q"))])
    raw = pipeline.raw_features(seq, pos, mask, 2.0, m, templates.empty(len(seq)))
    cfg = pipeline.PipelineConfig(crop_size=8, max_msa_clusters=4, max_extra_msa=4, num_recycling_iters=1)
    f = pipeline.process_features(raw, cfg, "train", seed=9)
    features.check(f, cfg.sizes(8))
    start = int(f["residue_index"][0, 0])
    assert f["residue_index"][:, 0].tolist() == list(range(start, start + 8))
    assert f["msa_row_mask"][:, 0].tolist() == [1, 1, 0, 0] and f["template_mask"].sum() == 0
    big = pipeline.PipelineConfig(crop_size=20, max_msa_clusters=4, max_extra_msa=4, num_recycling_iters=1)
    g = pipeline.process_features(raw, big, "train", seed=9)
    assert g["seq_mask"][:, 0].tolist() == [1.0] * 12 + [0.0] * 8 and int(g["seq_length"][0]) == 12


def _lddt_ca(pred: np.ndarray, true: np.ndarray, cutoff: float = 15.0) -> float:
    """lDDT-Ca (Mariani et al. 2013): pairs within 15 A in the truth, fraction of distance differences under
    0.5/1/2/4 A, averaged over residues."""
    dt = np.linalg.norm(true[:, None] - true[None], axis=-1)
    dp = np.linalg.norm(pred[:, None] - pred[None], axis=-1)
    pairs = (dt < cutoff) & ~np.eye(len(true), dtype=bool)
    err = np.abs(dt - dp)
    score = np.mean([(err < t) for t in (0.5, 1.0, 2.0, 4.0)], axis=0)
    per_res = (score * pairs).sum(-1) / np.maximum(pairs.sum(-1), 1)
    return float(per_res.mean())


def test_structure_follows_sequence_and_beats_trivial_predictors(synthetic):
    rows = store.read_chains(synthetic / "pdb_mmcif/processed/chains.csv")
    dicts = store.Dicts(synthetic / "pdb_mmcif/processed/dicts")
    ca = rc.ATOM_ORDER["CA"]
    helix_scores, extended_scores = [], []
    for r in rows:
        true = dicts.load(r.pdb_id).atoms["A"].positions[:, ca]
        rule = synth.structure(r.sequence)[0][:, ca]
        assert _lddt_ca(rule, true) > 0.99  # the structure is the sequence's rule
        helix = synth.structure("A" * len(r.sequence))[0][:, ca]
        extended = synth.structure("V" * len(r.sequence))[0][:, ca]
        helix_scores.append(_lddt_ca(helix, true))
        extended_scores.append(_lddt_ca(extended, true))
    # what an ideal helix or an extended chain reaches: a mini target must sit well above both
    assert max(np.mean(helix_scores), np.mean(extended_scores)) < 0.6  # a mini target of 0.7+ is above them
    assert min(np.mean(helix_scores), np.mean(extended_scores)) > 0.1


def test_full_preset_pipeline_is_the_references_initial_training_data_config() -> None:
    """docs/closed.md, the OpenFold data table: the pipeline the full preset builds (crop 256, 124 MSA clusters,
    1,024 extra sequences, 4 templates, 3 recycling iterations) and the reference's masked-MSA rates and clamped-FAPE
    probability, which the config does not change."""
    from hpcbench import registry

    cls = registry.get("openfold")
    cfg = cls.load_config("full")
    pc = cls(cfg).dataset().pipeline_config()
    assert (pc.crop_size, pc.max_msa_clusters, pc.max_extra_msa, pc.max_templates, pc.num_recycling_iters) == \
        (256, 124, 1024, 4, 3)
    assert (pc.masked_msa_replace_fraction, pc.masked_msa_uniform_prob, pc.masked_msa_profile_prob,
            pc.masked_msa_same_prob) == (0.15, 0.1, 0.1, 0.1)
    assert pc.use_clamped_fape_probability == 0.9 and cfg.data.random_recycling
