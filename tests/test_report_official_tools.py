"""`hpcbench report` and the official tools on synthetic submission folders: the summarizer's row is the one of
the benchmark's own system file (not the first with the same system_name), a shipped scaling.json normalizes our
score as it normalizes the summarizer's, and the tools run on a copy, so the input stays byte-identical and the
verdict does not change between runs (their RCP check deletes and rewrites scaling.json in closed folders)."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from hpcbench.report.build import build, write_report
from hpcbench.report.compare import SCORE
from hpcbench.report.discover import Group
from hpcbench.report.official import Official, _fill, available
from mllog_synth import SynthRun, write_benchmark

needs_tools = pytest.mark.skipif(not available(), reason="mlperf-logging is not installed")


def _tree_hash(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def _strong(root: Path, system: str, base: float, division: str = "open", n: int = 5, **kw: object) -> Path:
    return write_benchmark(root, "strong", [SynthRun(i * 1000.0, base + 7.0 * i, seed=i + 1, **kw)  # type: ignore[arg-type]
                                            for i in range(n)], system=system, division=division)


def _rename_system(root: Path, system: str, name: str) -> None:
    f = root / "systems" / f"{system}.json"
    f.write_text(json.dumps({**json.loads(f.read_text()), "system_name": name}))


def _olympic(times: list[float]) -> float:
    kept = sorted(times)[1:-1]
    return sum(kept) / len(kept) / 60.0


# 1. the summarizer's row of the system file, not of the system name -------------------------------------------

@needs_tools
def test_summarizer_rows_are_matched_by_system_file_not_by_a_shared_system_name(tmp_path: Path) -> None:
    """Fujitsu's closed and open HPC v3.0 systems share a system_name, as NVIDIA's four "eos" ones do: each
    folder gets its own row's figure (before: the open folder showed the closed row's olympic mean)."""
    _strong(tmp_path, "box_closed", 300.0, division="closed")
    _strong(tmp_path, "box_open", 600.0, division="open")
    for system in ("box_closed", "box_open"):
        _rename_system(tmp_path, system, "shared")
    groups = {g.group.system: g for g in build(tmp_path, None).groups}
    for system, base in (("box_closed", 300.0), ("box_open", 600.0)):
        g = groups[system]
        assert g.official is not None and g.official.produced, g.official
        assert g.score.score_min == pytest.approx(_olympic([base + 7.0 * i for i in range(5)]))
        assert g.official.score_min == pytest.approx(g.score.score_min, abs=1e-6), system
        assert not [c for c in g.disagreements if "olympic" in c.what], g.disagreements


def _group(system: str, desc: dict[str, object]) -> Group:
    return Group(system, "strong", "cosmoflow", Path("/x/results") / system / "strong" / "cosmoflow", [], desc)


def _row(system: str, division: str, nodes: str, value: str, url: str | None) -> dict[str, str]:
    row = {"division": division, "system": system, "number_of_nodes": nodes, "cosmoflow": value}
    if url is not None:
        row["details_url"] = f"https://github.com/mlcommons/hpc_results_v3.0/blob/main/Org/systems/{url}.json"
    return row


def test_row_is_the_one_whose_details_url_names_the_system_file() -> None:
    rows = [_row("eos", "closed", "256", "0.83", "eos_n256"), _row("eos", "closed", "260", "7.51", "eos_n260"),
            _row("eos", "open", "260", "9.99", "eos_n260_open")]
    off = Official()
    _fill(off, _group("eos_n260", {"system_name": "eos", "division": "closed", "number_of_nodes": "260"}), rows, 0, "")
    assert off.produced and off.score_min == 7.51
    off = Official()  # the row of the system file, but another division: not this folder's figure
    _fill(off, _group("eos_n260", {"system_name": "eos", "division": "open"}), rows, 0, "")
    assert not off.produced and "details_url names systems/eos_n260.json in the open division" in off.why_none


def test_without_details_url_name_and_division_decide_and_an_ambiguous_name_gives_no_figure() -> None:
    rows = [_row("fugaku", "closed", "512", "114.35", None), _row("fugaku", "open", "512", "123.57", None)]
    off = Official()
    _fill(off, _group("fugaku_open", {"system_name": "fugaku", "division": "open", "number_of_nodes": "512"}), rows, 0, "")
    assert off.score_min == 123.57
    rows = [_row("eos", "closed", "256", "0.83", None), _row("eos", "closed", "260", "7.51", None)]
    off = Official()
    _fill(off, _group("eos_n260", {"system_name": "eos", "division": "closed", "number_of_nodes": "260"}), rows, 0, "")
    assert off.score_min == 7.51  # number_of_nodes tells them apart
    off = Official()
    _fill(off, _group("eos_x", {"system_name": "eos", "division": "closed", "number_of_nodes": "64"}), rows, 0, "")
    assert not off.produced and "2 rows for system 'eos'" in off.why_none and "none taken" in off.why_none


# 2. scaling.json ------------------------------------------------------------------------------------------------

@needs_tools
def test_shipped_scaling_json_normalizes_our_score_as_the_summarizer_does(tmp_path: Path) -> None:
    folder = _strong(tmp_path, "box", 300.0)
    (folder / "scaling.json").write_text(json.dumps({"scaling_factor": 1.25}))
    (g,) = build(tmp_path, None).groups
    raw = _olympic([300.0 + 7.0 * i for i in range(5)])
    assert g.score.olympic_min == pytest.approx(raw)
    assert g.score.scaling_factor == 1.25 and g.score.scaling_file == str(folder / "scaling.json")
    assert g.score.score_min == pytest.approx(raw * 1.25)
    assert g.official is not None and g.official.score_min == pytest.approx(raw * 1.25, abs=1e-6)
    assert g.official.scaling_factor == pytest.approx(1.25)
    whats = {c.what: c for c in g.checks}
    assert whats["olympic mean before scaling (min)"].ours == pytest.approx(raw)
    assert whats[SCORE].agree is True
    assert whats["scaling_factor (the folder's scaling.json, as shipped)"].agree is True
    assert not g.disagreements and not g.score.flags, (g.disagreements, g.score.flags)
    assert any("x scaling_factor 1.25 from" in n and "scaling.json" in n for n in g.score.notes)


@pytest.mark.parametrize("content, want", [
    ("{not json", "not readable JSON"),
    ("[1.1]", "expected a JSON object with the key 'scaling_factor'"),
    ('{"factor": 1.1}', "the key 'scaling_factor' is missing"),
    ('{"scaling_factor": "1.1"}', "'scaling_factor' is '1.1'; expected a finite number > 0"),
    ('{"scaling_factor": 0}', "'scaling_factor' is 0; expected a finite number > 0"),
])
def test_a_malformed_scaling_json_is_a_flag_naming_the_file_and_key(tmp_path: Path, content: str, want: str) -> None:
    folder = _strong(tmp_path, "box", 300.0)
    (folder / "scaling.json").write_text(content)
    (g,) = build(tmp_path, None, official=False).groups
    assert g.score.score_min is None and g.score.olympic_min == pytest.approx(_olympic([300.0 + 7.0 * i for i in range(5)]))
    (flag,) = [f for f in g.score.flags if "scaling.json" in f]
    assert str(folder / "scaling.json") in flag and want in flag, flag
    assert not g.verdict.valid


def test_weak_scaling_ignores_scaling_json_as_the_summarizer_does(tmp_path: Path) -> None:
    folder = write_benchmark(tmp_path, "weak", [SynthRun(i * 1.0, 300.0 + i, seed=i + 1) for i in range(4)])
    (folder / "scaling.json").write_text(json.dumps({"scaling_factor": 2.0}))
    (g,) = build(tmp_path, None, official=False).groups
    assert g.score.ttta_min == pytest.approx((3.0 + 303.0) / 60.0)
    assert g.score.scaling_factor is None and any("ignored" in n and "strong-scaling" in n for n in g.score.notes)


# 3. the input is never written to --------------------------------------------------------------------------------

def _rcp_normalized(root: Path) -> Path:
    """Ten closed cosmoflow runs at global batch 32 converging at epochs 7 and 8 (olympic mean 7.5 epochs): within
    the hpc 3.0.0 RCP's max speedup, faster than its mean, so the RCP check writes scaling.json (factor ~1.0495)."""
    folder = write_benchmark(root, "strong", [SynthRun(i * 1000.0, 300.0 + 7.0 * i, seed=i + 1, epochs=7 + i % 2)
                                              for i in range(10)], division="closed", extra={"global_batch_size": 32})
    return folder


@needs_tools
def test_the_official_tools_leave_the_input_byte_identical_and_the_verdict_stable(tmp_path: Path) -> None:
    """Before: the summarizer and the package checker, run on the input at once, deleted and rewrote its
    scaling.json; the next report's official figure was multiplied by the RCP checker's factor (real: NVIDIA HPC
    v3.0 eos_n260 openfold 7.512238, then 8.054358, a disagreement)."""
    root = tmp_path / "sub"
    folder = _rcp_normalized(root)
    before = _tree_hash(root)
    raw = _olympic([300.0 + 7.0 * i for i in range(10)])
    figures = []
    for k in range(2):
        rep = write_report(root, tmp_path / f"out{k}", make_plots=False)
        assert _tree_hash(root) == before, f"run {k + 1} changed the input"
        (g,) = rep.groups
        assert g.official is not None and g.official.produced
        assert g.score.score_min == pytest.approx(raw) and g.score.scaling_factor is None
        assert g.official.score_min == pytest.approx(raw, abs=1e-6) and g.official.scaling_factor == pytest.approx(1.0)
        assert g.official.rcp_rewrote and g.official.rcp_factor == pytest.approx(7.870967741935484 / 7.5)
        assert not g.disagreements, g.disagreements
        assert rep.submission is not None and rep.submission.package is not None and rep.submission.package.ok
        assert rep.submission.package.command[3] == str(root)  # the copy's path is mapped back to the input's
        assert "/package/sub/" not in rep.submission.package.output
        figures.append((g.official.score_min, g.verdict.failures))
    assert figures[0] == figures[1]
    assert not (folder / "scaling.json").exists()
    # a shipped scaling.json is the one used, by both, and stays as shipped
    (folder / "scaling.json").write_text('{"scaling_factor": 1.1}\n')
    before = _tree_hash(root)
    (g,) = build(root, None).groups
    assert _tree_hash(root) == before
    assert g.score.score_min == pytest.approx(raw * 1.1)
    assert g.official is not None and g.official.score_min == pytest.approx(raw * 1.1, abs=1e-6)
    assert g.official.rcp_rewrote and g.official.rcp_factor == pytest.approx(7.870967741935484 / 7.5)
    assert not g.disagreements, g.disagreements
    rcp = [c for c in g.checks if "RCP check writes" in c.what]
    assert len(rcp) == 1 and rcp[0].ours == 1.1 and rcp[0].agree is None


def test_without_the_official_tools_the_table_and_csv_show_the_factor_and_the_raw_mean(tmp_path: Path) -> None:
    """``report --no-official`` on a folder shipping scaling.json: the table names the raw olympic mean, the factor and
    the normalized score (was: the normalized score labelled 'olympic mean (min)'); report.csv has both figures."""
    import csv

    from hpcbench.report.build import write_report
    from hpcbench.report.tables import print_group

    folder = _strong(tmp_path, "box", 300.0)
    (folder / "scaling.json").write_text(json.dumps({"scaling_factor": 1.25}))
    rep = write_report(tmp_path, tmp_path / "out", official=False, make_plots=False)
    raw = _olympic([300.0 + 7.0 * i for i in range(5)])
    (row, *_) = list(csv.DictReader((tmp_path / "out" / "report.csv").open()))
    assert float(row["olympic_min"]) == pytest.approx(raw) and float(row["scaling_factor"]) == 1.25
    assert float(row["score_min"]) == pytest.approx(raw * 1.25)
    from rich.console import Console

    console = Console(record=True, width=200)
    g = rep.groups[0]
    print_group(console, g.score, g.official, g.checks, g.verdict, g.group)
    text = console.export_text()
    assert "olympic mean before scaling (min)" in text and "scaling_factor (the folder's scaling.json)" in text
    assert f"{raw:.4f}" in text and f"{raw * 1.25:.4f}" in text
