"""OpenFold readers on files written here from the published formats (mmCIF, A3M, HHR, the reference's
preprocessed caches), and on corrupt ones: every refusal names the file and what was expected."""
from __future__ import annotations

import gzip
import json
import math
import pickle
import re
import zlib

import numpy as np
import pytest

from hpcbench.common.errors import DataError
from hpcbench.workloads.openfold_mlperf import features
from hpcbench.workloads.openfold_mlperf.data import a3m, cif, hhr, mmcif, store
from hpcbench.workloads.openfold_mlperf.residue_constants import ATOM_ORDER

# --- an mmCIF entry written by hand in the PDBx/mmCIF syntax: 2 entities (peptide + water), chain A has
# an MSE, an unknown residue (UNL... here 'DAL' = D-alanine, not in the 20), a residue with no atoms, a
# residue missing its CA, an alternate location and a second model that must be ignored.
CIF = """data_1ABC
#
_entry.id   1ABC
_exptl.method 'X-RAY DIFFRACTION'
_refine.ls_d_res_high 2.10
loop_
_pdbx_audit_revision_history.ordinal
_pdbx_audit_revision_history.revision_date
1 2019-05-08
2 2018-03-14
#
loop_
_struct_asym.id
_struct_asym.entity_id
A 1
B 2
loop_
_chem_comp.id
_chem_comp.type
GLY 'peptide linking'
MSE 'L-peptide linking'
DAL 'D-peptide linking'
ALA 'L-peptide linking'
HOH non-polymer
loop_
_entity_poly_seq.entity_id
_entity_poly_seq.num
_entity_poly_seq.mon_id
1 1 GLY
1 2 MSE
1 3 DAL
1 4 ALA
1 5 GLY
_struct.title
;A hand-written entry
with a text field
;
loop_
_atom_site.group_PDB
_atom_site.id
_atom_site.label_atom_id
_atom_site.label_alt_id
_atom_site.label_comp_id
_atom_site.label_asym_id
_atom_site.label_seq_id
_atom_site.auth_seq_id
_atom_site.auth_asym_id
_atom_site.Cartn_x
_atom_site.Cartn_y
_atom_site.Cartn_z
_atom_site.occupancy
_atom_site.pdbx_PDB_model_num
ATOM   1  N   . GLY A 1 10 X 0.0 0.0 0.0 1.0 1
ATOM   2  CA  . GLY A 1 10 X 1.4 0.0 0.0 1.0 1
ATOM   3  C   . GLY A 1 10 X 2.0 1.3 0.0 1.0 1
HETATM 4  N   . MSE A 2 11 X 3.3 1.5 0.0 1.0 1
HETATM 5  CA  . MSE A 2 11 X 3.9 2.8 0.0 1.0 1
HETATM 6  SE  . MSE A 2 11 X 5.0 3.0 1.0 1.0 1
ATOM   7  CA  A DAL A 3 12 X 6.0 3.0 0.0 0.4 1
ATOM   8  CA  B DAL A 3 12 X 6.5 3.5 0.5 0.6 1
ATOM   9  N   . ALA A 4 13 X 7.0 4.0 0.0 1.0 1
ATOM   10 "C" . ALA A 4 13 X 8.0 4.0 0.0 1.0 1
HETATM 11 O   . HOH B . 99 W 20.0 20.0 20.0 1.0 1
ATOM   12 N   . GLY A 1 10 X 50.0 0.0 0.0 1.0 2
"""


def test_cif_tokens_loops_quotes_text_fields(tmp_path):
    d = cif.parse(CIF, "x.cif")
    assert d["_exptl.method"] == ["X-RAY DIFFRACTION"]
    assert d["_struct.title"] == ["A hand-written entry\nwith a text field"]
    assert d["_atom_site.label_atom_id"][9] == "C"
    assert len(d["_atom_site.id"]) == 12
    assert cif.parse("data_X\n_a.b 'it''s'\n", "q")["_a.b"] == ["it''s"]  # a quote closes only before a blank


def test_mmcif_structure_as_reference(tmp_path):
    path = tmp_path / "1abc.cif.gz"
    path.write_bytes(gzip.compress(CIF.encode()))
    s = mmcif.read(path)
    assert (s.pdb_id, s.release_date, s.resolution) == ("1abc", "2018-03-14", 2.10)
    assert s.author_chain_ids == ["X"] and s.mmcif_chain_id_to_author_chain_id == {"A": "X", "B": "W"}
    assert s.sequences == {"X": "GMXAG"}  # MSE -> M, D-alanine unknown -> X
    pos, mask = s.atoms["X"].positions, s.atoms["X"].mask
    assert pos.shape == (5, 37, 3) and mask.dtype == bool
    assert mask[1, ATOM_ORDER["SD"]] and pos[1, ATOM_ORDER["SD"]].tolist() == [5.0, 3.0, 1.0]  # SE -> SD
    assert pos[2, ATOM_ORDER["CA"]].tolist() == [6.5, 3.5, 0.5]  # altloc B: higher occupancy
    assert mask[3, ATOM_ORDER["N"]] and not mask[3, ATOM_ORDER["CA"]]  # missing backbone atom stays masked
    assert not mask[4].any()  # SEQRES residue without atoms
    assert pos[0, ATOM_ORDER["N"]].tolist() == [0.0, 0.0, 0.0]  # model 2 ignored


@pytest.mark.parametrize("edit,needle", [
    (lambda t: t.replace("_entry.id   1ABC", ""), "_entry.id"),
    (lambda t: t.replace("1 4 ALA\n", "1 4 ALA\n1 6\n"), "expected a multiple"),
    (lambda t: t.replace("X 7.0 4.0", "X seven 4.0"), "row 9"),
    (lambda t: t.replace("_atom_site.Cartn_z\n", "_atom_site.Cartn_w\n"), "_atom_site.Cartn_z"),
    (lambda t: t.replace(";A hand", ";A hand").replace("with a text field\n;\n", "with a text field\n"), "never closed"),
    (lambda t: t.replace("'X-RAY DIFFRACTION'", "'X-RAY DIFFRACTION"), "never closed"),
    (lambda t: t.replace("A 4 13 X 8.0", "A 9 13 X 8.0"), "outside its sequence"),
    (lambda t: t.replace("'peptide linking'", "'RNA linking'").replace("'L-peptide linking'", "'RNA linking'")
     .replace("'D-peptide linking'", "'RNA linking'"), "no peptide polymer"),
    (lambda t: t.replace("2019-05-08", "08/05/2019"), "YYYY-MM-DD"),
])
def test_mmcif_corrupt_is_named(tmp_path, edit, needle):
    path = tmp_path / "bad.cif"
    path.write_text(edit(CIF))
    with pytest.raises(DataError, match=needle) as e:
        mmcif.read(path)
    assert str(path) in str(e.value)


A3M = """>query
MKVLAG
>hit1 desc
MKaaVL-G
>hit2
MRVLAG
>hit1dup
MKVL-G
>hit3
MKVL-G
"""


def test_a3m_insertions_deletions_and_features():
    m = a3m.parse(A3M, "u.a3m")
    assert m.sequences == ["MKVLAG", "MKVL-G", "MRVLAG", "MKVL-G", "MKVL-G"]
    assert m.deletions[1] == [0, 0, 2, 0, 0, 0]
    f = a3m.msa_features("MKVLAG", [("u.a3m", m), ("b.a3m", a3m.parse(">q\nMKVLAG\n>z\nAAAAAA\n", "b.a3m"))])
    assert f["msa"].shape == (4, 6) and f["msa"].dtype == np.int32  # duplicates across files dropped
    assert f["deletion_matrix_int"][1].tolist() == [0, 0, 2, 0, 0, 0]
    assert f["num_alignments"].tolist() == [4] * 6
    empty = a3m.msa_features("MKV", [])
    assert empty["msa"].shape == (1, 3)


def test_a3m_corrupt_is_named():
    with pytest.raises(DataError, match=r"u.a3m: row 1 .*5 aligned columns.* query has 6"):
        a3m.parse(">q\nMKVLAG\n>h\nMKVLA\n", "u.a3m")
    with pytest.raises(DataError, match=r"u.a3m: row 1 .*residue code '\*'"):
        a3m.parse(">q\nMKVLAG\n>h\nMKVL*G\n", "u.a3m")
    with pytest.raises(DataError, match="u.a3m: sequence text before"):
        a3m.parse("MKV\n>q\nMKV\n", "u.a3m")
    with pytest.raises(DataError, match="other.a3m: the alignment's query has 3 columns"):
        a3m.msa_features("MKVLAG", [("other.a3m", a3m.parse(">q\nMKV\n", "other.a3m"))])


def _hhr_block(no, name, q, qs, t, ts, sum_probs=40.5, cols=6):
    qe = qs + len(q.replace("-", "")) - 1
    te = ts + len(t.replace("-", "")) - 1
    return (f"No {no}\n>{name} Some protein\n"
            f"Probab=99.90  E-value=1e-20  Score=150.3  Aligned_cols={cols}  Identities=50%  Similarity=0.612  "
            f"Sum_probs={sum_probs}  Template_Neff=7.1\n\n"
            f"Q ss_pred             {'C' * len(q)}\n"
            f"Q {'query':<15}{qs:>4} {q} {qe:>4} (60)\n"
            f"Q Consensus       {qs:>4} {'x' * len(q)} {qe:>4} (60)\n"
            f"T Consensus       {ts:>4} {'x' * len(t)} {te:>4} (80)\n"
            f"T {name:<15}{ts:>4} {t} {te:>4} (80)\n"
            f"T ss_dssp             {'C' * len(t)}\n\n")


HHR = ("Query         query\nMatch_columns 60\n\n No Hit                             Prob E-value\n"
       "  1 1xyz_B Some protein         99.9   1e-20\n\n"
       + _hhr_block(1, "1xyz_B", "MKV-LAG", 3, "MRVELAG", 10)
       + _hhr_block(2, "2abc_A", "KVLA", 4, "KV-A", 1, sum_probs=12.0, cols=3))


def test_hhr_hits():
    hits = hhr.parse(HHR, "p.hhr")
    assert [h.name.split()[0] for h in hits] == ["1xyz_B", "2abc_A"]
    h = hits[0]
    assert (h.index, h.aligned_cols, h.sum_probs) == (1, 6, 40.5)
    assert h.query == "MKV-LAG" and h.hit_sequence == "MRVELAG"
    assert h.indices_query == [2, 3, 4, -1, 5, 6, 7] and h.indices_hit == [9, 10, 11, 12, 13, 14, 15]
    assert hits[1].indices_hit == [0, 1, -1, 2]


def test_hhr_corrupt_is_named():
    bad = HHR.replace("Sum_probs=40.5", "Sum_prob=40.5")
    with pytest.raises(DataError, match="p.hhr: hit block 'No 1'.*summary line"):
        hhr.parse(bad, "p.hhr")
    bad = HHR.replace("MRVELAG", "MRVELA")
    with pytest.raises(DataError, match="p.hhr: hit block 'No 1'.*template row"):
        hhr.parse(bad, "p.hhr")


def test_chains_obsolete_and_alignment_db(tmp_path):
    (tmp_path / "chains.csv").write_text(
        "pdb_chain_id,pdb_id,author_chain_id,mmcif_chain_ids,release_date,resolution,pdb_cluster_id,"
        "sequence_length,sequence\n1abc_A,1abc,A,A;C,2018-03-14,2.1,7,5,GMXAG\n2xyz_NA,2xyz,NA,B,2019-01-01,,-1,3,MKV\n")
    rows = store.read_chains(tmp_path / "chains.csv")
    assert rows[0].mmcif_chain_ids == "A;C" and rows[0].pdb_cluster_id == 7
    assert math.isnan(rows[1].resolution) and rows[1].author_chain_id == "NA"
    (tmp_path / "bad.csv").write_text("pdb_chain_id,pdb_id\n1abc_A,1abc\n")
    with pytest.raises(DataError, match=r"bad.csv: missing columns \['author_chain_id'"):
        store.read_chains(tmp_path / "bad.csv")
    (tmp_path / "bad2.csv").write_text((tmp_path / "chains.csv").read_text().replace(",5,GMXAG", ",6,GMXAG"))
    with pytest.raises(DataError, match="bad2.csv: line 2: sequence_length 6"):
        store.read_chains(tmp_path / "bad2.csv")
    store.write_chains(tmp_path / "again.csv", rows)
    assert repr(store.read_chains(tmp_path / "again.csv")) == repr(rows)

    (tmp_path / "obsolete.dat").write_text(
        " LIST OF OBSOLETE COORDINATE ENTRIES AND SUCCESSORS\nOBSLTE    31-JUL-94 116L     216L\n"
        "OBSLTE    29-FEB-96 1BIO     \n")
    assert store.read_obsolete(tmp_path / "obsolete.dat") == {"116l": "216l"}

    # the layout preprocess_open_protein_set.py writes, built here by hand
    aln = tmp_path / "pdb_alignments"
    aln.mkdir()
    files = {"bfd_uniclust_hits.a3m": b">q\nMKV\n", "pdb70_hits.hhr": b"Query q\n"}
    blob, spec, start = b"", [], 0
    for name in sorted(files):
        spec.append([name, start, len(files[name])])
        blob += files[name]
        start += len(files[name])
    (aln / "3.db").write_bytes(blob)
    (aln / "super.index").write_text(json.dumps({"1abc_A": {"db": "3.db", "files": spec},
                                                 "1abc_C": {"db": "3.db", "files": spec}}))
    db = store.AlignmentDB(aln)
    assert db.load("1abc_C") == {k: v.decode() for k, v in files.items()}
    with pytest.raises(DataError, match="no alignments for chain '9zzz_A'"):
        db.load("9zzz_A")
    (aln / "3.db").write_bytes(blob[:-2])
    with pytest.raises(DataError, match=r"3.db: 1abc_A/pdb70_hits.hhr spans bytes"):
        db.load("1abc_A")
    (aln / "super.index").write_text(json.dumps({"1abc_A": {"db": "3.db", "files": [["x", 0]]}}))
    with pytest.raises(DataError, match="super.index: entry '1abc_A' is not"):
        store.AlignmentDB(aln)
    out = tmp_path / "written"
    store.write_alignment_db(out, {0: [(["1abc_A", "1abc_C"], files)]})
    assert store.AlignmentDB(out).load("1abc_C") == {k: v.decode() for k, v in files.items()}


def test_dicts_pickled_needs_opt_in_and_npz_round_trip(tmp_path):
    s = mmcif.parse(CIF, "x.cif")
    ref = s.to_reference_dict()
    # the reference's preprocess: atoms compressed with zlib, {pdb_id: mmcif_dict} pickled per pdb_id[1:3]
    ref["atoms"] = {c: {"all_atom_positions": (zlib.compress(a["all_atom_positions"].tobytes()),
                                               a["all_atom_positions"].shape),
                        "all_atom_mask": (zlib.compress(a["all_atom_mask"].tobytes()), a["all_atom_mask"].shape)}
                    for c, a in ref["atoms"].items()}
    dicts = tmp_path / "dicts"
    dicts.mkdir()
    (dicts / "ab").write_bytes(pickle.dumps({"1abc": ref}))
    with pytest.raises(DataError, match=r"dicts/ab: is a pickle; unpickling runs code"):
        store.Dicts(dicts).load("1abc")
    got = store.Dicts(dicts, trust_pickle=True).load("1abc")
    assert got.sequences == s.sequences
    np.testing.assert_array_equal(got.atoms["X"].positions, s.atoms["X"].positions)
    out = tmp_path / "safe"
    assert store.convert_pickled_dicts(dicts, out) == 1
    back = store.Dicts(out).load("1abc")
    np.testing.assert_array_equal(back.atoms["X"].mask, s.atoms["X"].mask)
    assert back.release_date == "2018-03-14"
    with pytest.raises(DataError, match="no entry '2abc'"):
        store.Dicts(out).load("2abc")


def test_schema_matches_reference_names():
    # the reference's FEATURE_SHAPES keys (mlcommons/hpc openfold/config.py), written down here independently
    ref = """aatype all_atom_mask all_atom_positions atom14_alt_gt_exists atom14_alt_gt_positions
    atom14_atom_exists atom14_atom_is_ambiguous atom14_gt_exists atom14_gt_positions atom37_atom_exists
    backbone_rigid_mask backbone_rigid_tensor bert_mask chi_angles_sin_cos chi_mask extra_deletion_value
    extra_has_deletion extra_msa extra_msa_mask extra_msa_row_mask is_distillation msa_feat msa_mask msa_row_mask
    pseudo_beta pseudo_beta_mask residue_index residx_atom14_to_atom37 residx_atom37_to_atom14 resolution
    rigidgroups_alt_gt_frames rigidgroups_group_exists rigidgroups_group_is_ambiguous rigidgroups_gt_exists
    rigidgroups_gt_frames seq_length seq_mask target_feat template_aatype template_all_atom_mask
    template_all_atom_positions template_alt_torsion_angles_sin_cos template_mask template_pseudo_beta
    template_pseudo_beta_mask template_sum_probs template_torsion_angles_mask template_torsion_angles_sin_cos
    true_msa""".split()
    assert sorted(features.FEATURES) == sorted(ref)
    assert features.FEATURES["msa_feat"].full_shape() == ("N_clust", "N_res", 49, "N_recycle")
    assert features.Sizes().resolve(features.FEATURES["extra_msa"].full_shape()) == (1024, 256, 4)


def test_truncated_or_damaged_npz_dicts_are_named(tmp_path):
    """A ``dicts/<xy>.npz`` cut short (its zip directory gone) or with garbage inside is a DataError
    naming the file and the entry, not zipfile.BadZipFile."""
    s = mmcif.parse(CIF, "x.cif")
    out = tmp_path / "dicts"
    out.mkdir()
    store.write_dicts(out, [s])
    npz = out / "ab.npz"
    good = npz.read_bytes()
    for bad in (good[:200], good[:len(good) // 2], good[:-30], b"PK\x03\x04" + b"\0" * 100, b""):
        npz.write_bytes(bad)
        with pytest.raises(DataError, match=r"dicts/ab\.npz: cannot read entry '1abc'"):
            store.Dicts(out).load("1abc")


@pytest.mark.parametrize("value", ["15/05/2020", "2020-5-15", "20200515", "2020-02-30", "", "2020-05-15T00:00",
                                   "2020-W20-5", " 2020-05-15"])
def test_chains_release_date_must_be_iso(tmp_path, value):
    """release_date is compared as a YYYY-MM-DD string (the training date window) and parsed as one
    (template dates): anything else is a DataError naming chains.csv, the line and the column."""
    good = "2xyz_NA,2xyz,NA,B,2019-01-01,,-1,3,MKV\n"
    (tmp_path / "chains.csv").write_text(
        "pdb_chain_id,pdb_id,author_chain_id,mmcif_chain_ids,release_date,resolution,pdb_cluster_id,"
        f"sequence_length,sequence\n{good}1abc_A,1abc,A,A;C,{value},2.1,7,5,GMXAG\n")
    want = rf"chains\.csv: line 3: column release_date: {re.escape(repr(value))}.*YYYY-MM-DD"
    with pytest.raises(DataError, match=want):
        store.read_chains(tmp_path / "chains.csv")
