"""The benchmark scripts print as they go, keep to ``--budget-s`` and say what they skipped (issue #16:
a CosmoFlow step benchmark on an AVX2-only CPU ran past 500 s and printed nothing). Timings are
never asserted: only that the run finishes, labels an emulated bf16 honestly and lists its skips."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import ROOT, project_env

from benchmarks.gpu_check import nvidia
from benchmarks.gpu_check.plan import plan_for


def bench(args: list[str], **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *args], cwd=ROOT, env=project_env(**env), capture_output=True, text=True,
                          timeout=120)


def test_cosmoflow_step_on_an_avx2_cpu_peaks_in_fp32_and_labels_bf16_emulated(tmp_path: Path) -> None:
    out = tmp_path / "cf.json"
    proc = bench(["-m", "benchmarks.cosmoflow_step", "--size", "8", "--conv-layers", "2", "--conv-channels", "4",
                  "--budget-s", "3", "--json", str(out)], ATEN_CPU_CAPABILITY="avx2", ONEDNN_MAX_CPU_ISA="AVX2")
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("# ") and "torch cpu capability AVX2" in lines[0] and "bf16 emulated" in lines[0]
    assert any(ln.startswith("measured fp32 matmul peak") for ln in lines)
    assert lines[-1].startswith("# done in ") and "of --budget-s 3" in lines[-1]
    res = json.loads(out.read_text())
    assert res["peak_dtype"] == "fp32" and res["bf16_native"] is False
    assert res["budget"]["budget_s"] == 3.0
    # the bf16 variant is either measured and marked emulated, or skipped and listed as skipped
    if "bf16_cl" in res["results"]:
        assert res["results"]["bf16_cl"]["bf16_emulated"] is True
        assert any("bf16_cl[emulated]" in ln for ln in lines)
    else:
        assert "variant bf16_cl" in res["budget"]["skipped"]
    assert res["results"]["baseline"]["speedup"] == 1.0


def test_a_spent_budget_skips_the_rest_and_says_so() -> None:
    proc = bench(["-m", "benchmarks.oc20_sampler_balance", "--samples", "2000", "--budget-s", "0.001"])
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "plain strided partition (baseline)" in proc.stdout  # the baseline is always measured
    assert "SKIPPED window-balanced partition (now) at 2 per rank: --budget-s 0.001 spent" in proc.stdout
    assert proc.stdout.splitlines()[-1].endswith("window-balanced partition (now) at 8 per rank")


def test_oc20_gemm_floor_replays_every_matrix_product_of_a_step_with_its_flops() -> None:
    """benchmarks.oc20_model_step --gemm-floor: every GEMM of a training step (forward and backward, a
    broadcast bias included) is recorded once with its FLOPs and replayed."""
    import torch

    from benchmarks.oc20_model_step import gemm_floor

    x = torch.randn(8, 4, requires_grad=True)
    lin = torch.nn.Linear(4, 3)
    w = torch.randn(2, 3, 5, requires_grad=True)

    def step() -> None:
        y = lin(x)  # addmm [8, 4] x [4, 3] with the bias broadcast
        z = torch.bmm(y.t().reshape(1, 3, 8).expand(2, 3, 8), torch.ones(2, 8, 5)) * w  # bmm
        z.sum().backward()  # lin: grad x (mm) and grad weight (mm); bmm: no grad to the constant ones

    seconds, calls, flops = gemm_floor(step, 2)
    # forward addmm 2*8*4*3, bmm 2*(2*3*8*5); backward: grad x [8,3]x[3,4], grad weight [3,8]x[8,4], and the
    # bmm's grad for its first argument [2,3,5]x[2,5,8]
    assert calls == 5 and flops == 192 + 480 + 192 + 192 + 480 and seconds > 0


def test_bert_packing_benchmark_runs_all_variants_within_its_budget() -> None:
    proc = bench(["-m", "benchmarks.bert_packing", "--seq-len", "64", "--vocab", "400", "--layers", "1", "--hidden", "32",
                  "--heads", "2", "--intermediate", "64", "--rows", "4", "--batches", "1", "--repeats", "1",
                  "--unpad-variant", "--budget-s", "60"])
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("# ") and "flags" in lines[0]
    assert any(ln.startswith("  round 1 batch 0: padded") and "packed" in ln and "padded+unpad" in ln for ln in lines)
    assert any(ln.startswith("packed / padded = ") for ln in lines)
    assert lines[-1].startswith("# done in ") and "of --budget-s 60" in lines[-1]


def test_bert_learn_prints_baselines_and_accuracy_as_it_trains() -> None:
    proc = bench(["-m", "benchmarks.bert_learn", "--hidden", "32", "--heads", "2", "--rows", "4", "--steps", "4",
                  "--eval-every", "2", "--budget-s", "60"])
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.splitlines()
    assert any("trivial (most frequent word)" in ln and "oracle (chain known)" in ln for ln in lines)
    assert sum("eval masked-LM accuracy" in ln for ln in lines) == 2
    assert lines[-1].startswith("# done in ")


def test_async_eval_benchmark_compares_inline_with_evaluation_ranks() -> None:
    proc = bench(["-m", "benchmarks.async_eval", "--pairs", "1", "--hidden", "16", "--train", "512", "--eval", "512",
                  "--batch", "16", "--target", "0.12", "--budget-s", "60"])
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("# ") and "flags" in lines[0]
    assert any(ln.startswith("  round 1 inline ") and "success" in ln for ln in lines)
    assert any(ln.startswith("  round 1 eval ") and "success" in ln for ln in lines)
    assert any(ln.startswith("ratio inline / eval-ranks (same training ranks) = ") for ln in lines)
    assert lines[-1].startswith("# done in ") and "of --budget-s 60" in lines[-1]


def test_resnet_loader_benchmark_prints_every_loader_and_its_ratio(tmp_path: Path) -> None:
    from hpcbench.workloads.mlperf_training.resnet.synth import write_dataset

    write_dataset(tmp_path / "data", classes=10, train_per_class=4, val_per_class=1, size=40, progress=False)
    out = tmp_path / "rl.json"
    proc = bench(["-m", "benchmarks.resnet_loader", "--data", str(tmp_path / "data"), "--batch", "8", "--steps", "1",
                  "--rounds", "1", "--multiplier", "2", "--budget-s", "60", "--json", str(out)])
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("# ") and "flags" in lines[0]
    assert any(ln.startswith("step rate (best round") for ln in lines)
    res = json.loads(out.read_text())
    rows = [k for k in res["results"] if k.startswith("pillow")]
    assert rows == ["pillow cache=none threads=0", "pillow cache=none threads=2", "pillow cache=host threads=0",
                    "pillow cache=host threads=2"]
    assert all(any(ln.strip().startswith(k) and "x" in ln for ln in lines) for k in res["results"])
    assert lines[-1].startswith("# done in ") and "of --budget-s 60" in lines[-1]


def test_jpeg_check_times_both_readers_against_the_pillow_decode(tmp_path: Path) -> None:
    proc = bench(["-m", "benchmarks.jpeg_check", "--work", str(tmp_path), "--size", "48", "--images", "8",
                  "--rounds", "1"])
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("# ") and "flags" in lines[0] and lines[1].startswith("data ") and "8 files" in lines[1]
    rows = [ln.split("  ")[0] for ln in lines[2:]]
    assert rows == ["pillow decode (baseline)", "strict decode (Pillow loader)", "DALI bytes, first read (1/8 check)",
                    "DALI bytes, later reads"]
    assert lines[2].endswith("1.00x the Pillow decode") and all("ms/image" in ln for ln in lines[2:])


def test_data_cache_names_the_machine_and_judges_each_workload(tmp_path: Path) -> None:
    out = tmp_path / "dc.json"
    proc = bench(["-m", "benchmarks.data_cache", "--work", str(tmp_path), "--shape", "tiny", "--epochs", "2",
                  "--batch", "2", "--device", "cpu", "--budget-s", "100", "--json", str(out)])
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("# ") and "transparent hugepages " in lines[0] and "(1/5/15 min)" in lines[0]
    for name in ("cosmoflow", "deepcam"):
        verdict = [ln for ln in lines if ln.startswith(f"{name}: cache=host ") and "less CPU per sample" in ln]
        assert len(verdict) == 2 and all(v.endswith(("met", "MISSED")) and "these are tiny shapes" in v for v in verdict)
        assert any("storage-dtype batch" in v for v in verdict) and any("CPU transform" in v for v in verdict)
        assert all("(median of paired rounds)" in v for v in verdict)
        assert len([ln for ln in lines if ln.startswith(f"{name} ") and "ratio per round (epochs 2..): " in ln]) == 2
    res = json.loads(out.read_text())
    assert res["machine"]["transparent_hugepage"] and len(res["machine"]["load_avg"]) == 3
    assert {len(res["workloads"][w][v][m]) for w in ("cosmoflow", "deepcam") for v in ("storage", "transform")
            for m in ("none", "host")} == {2}
    assert all(len(res["workloads"][w][v]["paired_cpu_ratio"]) == 1 for w in ("cosmoflow", "deepcam")
               for v in ("storage", "transform"))
    assert all(e["minor_faults_per_batch"] >= 0 for w in ("cosmoflow", "deepcam") for v in ("storage", "transform")
               for m in ("none", "host") for e in res["workloads"][w][v][m])


def test_transform_outputs_compares_fresh_and_reused_outputs_of_equal_values() -> None:
    proc = bench(["-m", "benchmarks.transform_outputs", "--rounds", "1", "--batch", "1"])
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("# ") and "transparent hugepages " in lines[0]
    rows = [ln for ln in lines if "fresh output" in ln and "reused output" in ln]
    assert len(rows) == 3 and rows[0].startswith("DeepCAM") and rows[1].startswith("CosmoFlow")
    assert "channels-first" in rows[2] and "channels-first" not in rows[1]  # both CosmoFlow layouts, same values


def test_llama_mfu_counts_the_8b_flops_and_reports_mfu_and_its_skips(tmp_path: Path) -> None:
    from benchmarks.llama_mfu import flops_per_token
    from hpcbench.workloads.mlperf_training.llama31_8b.model import LLAMA31_8B, parameter_count

    c = LLAMA31_8B  # 6 N: every weight but the embedding table and the norms; attention 12 L d S
    matmul = parameter_count(c) - c.vocab_size * c.dim - (2 * c.layers + 1) * c.dim
    assert matmul == 7_504_658_432
    assert flops_per_token(c, 8192) == 6 * matmul + 12 * 32 * 4096 * 8192
    out = tmp_path / "mfu.json"
    proc = bench(["-m", "benchmarks.llama_mfu", "--shapes", "mini", "--variants", "eager,cudagraphs,fp8", "--steps", "2",
                  "--warmup", "1", "--peak-s", "0.5", "--device", "cpu", "--budget-s", "60", "--json", str(out)])
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("# ") and "torch threads 1" in lines[0]
    assert any(ln.startswith("measured bfloat16 matmul peak") or ln.startswith("measured float32 matmul peak")
               for ln in lines)
    assert any(ln.startswith("  mini eager") and "tokens/s" in ln and "MFU" in ln for ln in lines)
    assert any("mini cudagraphs skipped: needs a CUDA GPU" in ln for ln in lines)
    assert "H100 goal: >= 45% MFU at 8B-shaped layers in bf16: not measured here (no GPU)" in lines
    assert lines[-1].startswith("# done in ")
    res = json.loads(out.read_text())
    eager = res["results"]["mini"]["eager"]
    assert eager["mfu"] == eager["model_flops_per_s"] / res["peak_flops"] > 0
    assert res["skipped"]["mini/cudagraphs"] == "needs a CUDA GPU" and "mini/fp8" in res["skipped"]


GPU_CHECK_WORKLOADS = __import__("hpcbench.registry").registry.names()  # every registered one, also new ones


@pytest.fixture(scope="module")
def gpu_check_smoke(tmp_path_factory: pytest.TempPathFactory) -> tuple[subprocess.CompletedProcess[str], dict, list[str]]:
    """``benchmarks.gpu_check --smoke`` over every registered workload, shared by the per-workload checks below,
    run as a GPU session runs it: in parts (here two, at once: one core each), merged with ``--merge``."""
    tmp = tmp_path_factory.mktemp("gpu_check_smoke")
    halves = (GPU_CHECK_WORKLOADS[0::2], GPU_CHECK_WORKLOADS[1::2])
    parts = [subprocess.Popen([sys.executable, "-m", "benchmarks.gpu_check", "--smoke", "--workloads", ",".join(names),
                               "--work", str(tmp / "data"), "--seconds", "0.2", "--epochs", "2", "--budget-s", "1200",
                               "--out", str(tmp / f"part{k}")], cwd=ROOT, env=project_env(), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for k, names in enumerate(halves)]
    try:
        outputs = [part.communicate(timeout=1500) for part in parts]
    finally:
        for part in parts:
            part.kill()
    for part, (stdout, stderr) in zip(parts, outputs):
        assert part.returncode == 0, stdout[-3000:] + stderr[-3000:]
        assert "Traceback" not in stderr, stderr[-3000:]
    out = tmp / "gpu_check"
    proc = subprocess.run([sys.executable, "-m", "benchmarks.gpu_check", "--merge", str(tmp / "part0.json"),
                           str(tmp / "part1.json"), "--out", str(out)], cwd=ROOT, env=project_env(),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc, json.loads(out.with_suffix(".json").read_text()), out.with_suffix(".txt").read_text().splitlines()


def _section(text: list[str], name: str) -> list[str]:
    """The lines of one workload's block in the results text (its '== name, ...' header up to the next block)."""
    start = next(i for i, ln in enumerate(text) if ln.startswith(f"== {name}, local batch "))
    end = next((i for i in range(start + 1, len(text)) if text[i].startswith(("== ", "# "))), len(text))
    return text[start:end]


@pytest.mark.slow  # the fixture: gpu_check --smoke over every workload, ~80-140 s
@pytest.mark.parametrize("name", GPU_CHECK_WORKLOADS)
def test_gpu_check_smoke_measures_every_figure_of_a_workload_on_the_cpu(
        name: str, gpu_check_smoke: tuple[subprocess.CompletedProcess[str], dict, list[str]]) -> None:
    """benchmarks.gpu_check --smoke (mini preset, CPU) gets through every figure of each registered workload:
    the step alone with its FLOPs, end to end through the loader (data.cache=none) and from the cache, the
    NVIDIA figure beside them, and one text + JSON result (it crashed once at its first end-to-end figure)."""
    from hpcbench import registry

    proc, res, text = gpu_check_smoke
    assert res["preset"] == "mini" and res["peak"]["flops"] > 0 and res["skipped"] == [] and res["complete"] is True
    (row,) = res["workloads"][name]["batches"]
    if getattr(registry.get(name), "shards_parameters", False):  # only the harness builds a sharded model
        assert row["model_only"] == {} and "model-only not measured" in res["workloads"][name]["note"], row
    else:
        eager = row["model_only"]["eager"]
        assert eager["samples_per_s"] > 0 and eager["steps"] >= 1, row
        assert row["flops_per_sample"] > 0 and not row["flops_error"], row  # OC20: counted without the module tracker
    cache = plan_for(name).cache
    for key, mode in (("loader", "none"), ("cache", cache)) if cache else (("loader", "none"),):
        e = row[key]
        assert e["cache"] == mode and e["status"] == "ok" and len(e["per_epoch"]) == 2 and e["rate"] > 0, e
        # where the step's time went (the harness's epoch_phases): the parts make up the epoch after the first,
        # whose rate is then at most the batch per step (BERT's packed rows can hold fewer sequences)
        split = e["per_step_ms"]
        assert split["steps"] >= 1 and split["data_wait"] > 0 and split["step"] > 0 and split["rest"] >= 0, e
        per_step = split["data_wait"] + split["step"] + split["rest"]
        assert 0 < e["rate"] * per_step / 1e3 <= row["batch"] * 1.001, e
    if not cache:  # a workload whose loader cannot cache says so in the cache's place
        assert row["cache"]["status"].startswith("not offered: "), row
    assert row["comparable"] is False  # mini shapes are never put beside NVIDIA's figure as a ratio
    assert (row["nvidia"] is not None) == bool(nvidia.figures_for(name)), row
    assert text[0].startswith("# ")
    block = _section(text, name)
    # the end-to-end line states the rate after epoch 1 with every epoch's rate (the parser's tracked
    # throughput is (samples/s, epoch ms) pairs: summing them once crashed the check here)
    (e2e,) = [ln for ln in block if "end to end, files -> loader -> device" in ln]
    assert float(e2e.split("): ")[1].split(" samples/s")[0]) > 0 and "samples/s after epoch 1 (epochs " in e2e, e2e
    assert any(ln.startswith("    per step after epoch 1: loader wait ") for ln in block), block
    assert "; ok)" in e2e and all(ln.endswith("samples/s (ok)") for ln in proc.stdout.splitlines()
                                  if " end to end data.cache=" in ln), proc.stdout
    assert any("end to end, files -> loader -> device (data.cache=none" in ln for ln in block)
    assert any((f"end to end, from the cache (data.cache={cache}" if cache else
                "end to end, from the cache: not offered: ") in ln for ln in block)
    assert text[-1] == "# skipped: nothing"


@pytest.mark.parametrize("name", GPU_CHECK_WORKLOADS)
def test_gpu_check_full_plan_loads_against_the_full_preset(name: str) -> None:
    """The overrides the GPU run uses (one GPU, NVIDIA's local batch) are keys and values the full preset
    accepts, so the GPU session does not fail on a config error the CPU could have caught."""
    from hpcbench import registry

    plan = plan_for(name)
    cls = registry.get(name)
    for batch in plan.batches_full:
        cfg = cls.load_config("full", ["data.root=/nonexistent", f"train.global_batch_size={batch}",
                                       "train.loader=torch", *plan.overrides_full])
        assert cfg.train.global_batch_size == batch
    if nvidia.figures_for(name):
        assert set(plan.batches_full) == {f.local_batch for f in nvidia.figures_for(name)}
    else:
        assert nvidia.missing_reason(name)


def test_gpu_check_nvidia_figures_are_the_ones_issue_29_quotes() -> None:
    assert [(f.local_batch, f.per_gpu) for f in nvidia.figures_for("cosmoflow")] == [(1, 200.8)]
    assert [(f.local_batch, f.per_gpu) for f in nvidia.figures_for("deepcam")] == [(1, 30.0), (8, 81.9)]
    assert [(f.local_batch, f.per_gpu) for f in nvidia.figures_for("oc20")] == [(4, 208.6), (16, 375.1)]
    assert all(f.source.startswith("mlcommons/") for f in nvidia.FIGURES)


def test_gpu_check_counts_the_test_summary_and_merges_parts(tmp_path: Path) -> None:
    from benchmarks.gpu_check import report, suite

    assert suite.counts_of("x\n3 failed, 170 passed, 4 skipped, 2 errors in 93.1s\n") == {
        "failed": 3, "passed": 170, "skipped": 4, "error": 2}
    assert suite.counts_of("no tests ran") == {}
    files = suite.gpu_test_files()
    assert "tests/test_gpu.py" in files and "tests/test_gpu_graphs.py" in files
    base = {"machine": "# m", "device_line": "# d", "preset": "full", "peak": {"flops": 1e15, "what": "bf16"},
            "skipped": []}
    row = {"batch": 1, "nvidia": {"workload": "cosmoflow", "local_batch": 1, "per_gpu": 200.0, "source": "s"},
           "comparable": True, "flops_per_sample": 1e11, "flops_error": "",
           "model_only": {"eager": {"mode": "eager", "samples_per_s": 100.0, "steps": 10, "samples_per_step": 1}},
           "loader": {"cache": "none", "mode": "eager", "per_epoch": [10.0, 50.0], "rate": 50.0, "status": "ok"}}
    a = {**base, "tests": {"selection": "gpu", "files": ["t"], "exit_code": 0, "seconds": 3.0,
                           "counts": {"passed": 2}, "problems": []}, "workloads": {"cosmoflow": {"batches": [row]}}}
    b = {**base, "workloads": {"oc20": {"error": "RuntimeError: x"}}, "skipped": ["oc20 batch 16"]}
    merged = report.merge([a, b])
    assert list(merged["workloads"]) == ["cosmoflow", "oc20"] and merged["tests"]["counts"] == {"passed": 2}
    txt, js = report.write(merged, tmp_path / "r")
    assert json.loads(js.read_text()) == merged
    lines = txt.read_text().splitlines()
    assert "== GPU tests (gpu: 1 files; exit 0, 3 s): 2 passed" in lines
    eager = next(ln for ln in lines if "model-only eager" in ln)
    assert "0.50x NVIDIA" in eager and "100 GFLOP/sample, 10 TFLOP/s = 1.0% of the peak" in eager
    assert any("files -> loader -> device" in ln and "0.25x NVIDIA, 0.50x of model-only eager" in ln for ln in lines)
    assert "== oc20: FAILED RuntimeError: x" in lines and lines[-1] == "# skipped: oc20 batch 16"


def test_gpu_check_keeps_what_a_cut_off_test_run_did(monkeypatch: pytest.MonkeyPatch) -> None:
    """On an H200 (2026-11-28) the GPU tests ran past their cut-off and the check said only "no summary
    line": a cut-off run now counts pytest's progress marks and keeps its last lines, and the workers do not
    each take every core (8 workers x 16 threads beside the data being written ran the load to 104)."""
    from benchmarks.gpu_check import suite

    # -q prints bare marks; a line with anything else in it (a file name, a count) is not a progress line
    assert suite.progress_counts("tests/x.py ..F.s  [ 40%]\n..sE\n.. [100%]\n3 passed\n") == {
        "passed": 4, "skipped": 1, "error": 1}
    assert suite.progress_counts("..F.s [ 40%]\n..sE\nsome text\n") == {
        "passed": 5, "failed": 1, "skipped": 2, "error": 1}
    env = suite.suite_env(8, cores=16)
    assert env["OMP_NUM_THREADS"] == "2" and env["MKL_NUM_THREADS"] == "2"
    assert suite.suite_env(4, cores=2)["OMP_NUM_THREADS"] == "1"

    def cut_off(cmd: list[str], **kw: object) -> None:
        assert kw["env"]["OMP_NUM_THREADS"] == str(max(1, (os.cpu_count() or 1) // 4))
        raise subprocess.TimeoutExpired(cmd, 5.0, output=b"bringing up nodes...\n....F. [ 50%]\n..",
                                        stderr=b"tests/test_gpu.py::test_x hangs")

    monkeypatch.setattr(suite.subprocess, "run", cut_off)
    r = suite.run_suite("gpu", 5.0, workers=4)
    assert r.exit_code == -1 and r.counts == {"passed before the cut-off": 7, "failed before the cut-off": 1}
    assert r.problems[-1] == "| cut off after 5 s" and "| tests/test_gpu.py::test_x hangs" in r.problems


def test_gpu_check_writes_each_figure_as_it_goes_and_marks_a_cut_off_run_partial(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A device call that reaches its limit kills the check: the figures measured before must be on disk
    (the H200 run of 2026-11-28 lost every HPC figure it had printed), marked partial."""
    from benchmarks.gpu_check import cli, report

    row = {"batch": 1, "nvidia": None, "missing": "m", "comparable": False, "model_only": {
        "eager": {"mode": "eager", "samples_per_s": 12.5, "steps": 3, "samples_per_step": 1}}}

    def killed(name: str, a: object, budget: object, device: object, share: float, skipped: list[str],
               out: dict, save: object) -> None:
        out.update({"note": "", "batches": [row]})
        save()
        raise SystemExit(137)  # the call's limit, in the middle of the next figure

    monkeypatch.setattr(cli, "run_workload", killed)
    monkeypatch.setattr(cli.measure, "gemm_peak", lambda device: (1e12, "fp32 GEMM on the CPU"))
    with pytest.raises(SystemExit):
        cli.main(["--smoke", "--workloads", "cosmoflow,deepcam", "--out", str(tmp_path / "r")])
    res = json.loads((tmp_path / "r.json").read_text())
    assert res["complete"] is False and res["workloads"]["cosmoflow"]["batches"] == [row]
    assert "deepcam" not in res["workloads"]
    text = (tmp_path / "r.txt").read_text().splitlines()
    assert text[2].startswith("# PARTIAL: this run stopped before its end")
    assert any("model-only eager" in ln and "12.5 samples/s" in ln for ln in text)
    started = report.render({**res, "workloads": {"oc20": {}}})
    assert "== oc20: started, no figure measured" in started[-2]
    assert report.merge([res, {**res, "complete": True}])["complete"] is False


def test_gpu_check_splits_the_end_to_end_step_from_the_job_summary(tmp_path: Path) -> None:
    """The per-step split comes from instance 0's epoch_phases in train_summary.json, over the epochs after the
    first (the first fills a cache, compiles, captures); no summary, or one without phases, gives none."""
    from benchmarks.gpu_check.measure import per_step_split

    phases = [{"epoch": 1, "seconds": 9.0, "steps": 10, "data_wait_s": 8.0, "step_s": 0.5},
              {"epoch": 2, "seconds": 1.0, "steps": 10, "data_wait_s": 0.1, "step_s": 0.7},
              {"epoch": 3, "seconds": 1.2, "steps": 10, "data_wait_s": 0.1, "step_s": 0.9}]
    rows = [{"instance": 1, "result": {"epoch_phases": phases[:1]}}, {"instance": 0, "result": {"epoch_phases": phases}}]
    (tmp_path / "train_summary.json").write_text(json.dumps(rows))
    split = per_step_split([tmp_path / "train_summary.json"])
    assert split["steps"] == 20
    assert (split["data_wait"], split["step"], split["rest"]) == pytest.approx((10.0, 80.0, 20.0))
    assert per_step_split([]) == {}
    (tmp_path / "train_summary.json").write_text(json.dumps([{"instance": 0, "result": None}]))
    assert per_step_split([tmp_path / "train_summary.json"]) == {}


def test_gpu_check_bounds_a_compilation_in_a_child_process(tmp_path: Path) -> None:
    """torch.compile cannot be interrupted where it compiles (DeepCAM's ran 3+ minutes past the check's
    budget on an H200): the compile mode is measured in a child that is killed at the deadline; the child's
    figure is the in-process one's."""
    from benchmarks.gpu_check import measure
    from benchmarks.gpu_check.cli import datagen

    root = tmp_path / "cosmoflow"
    datagen(plan_for("cosmoflow"), root, True, 300)
    sets = [f"data.root={root}", "train.global_batch_size=2", "train.loader=torch"]
    r = measure.model_only_bounded("cosmoflow", "mini", sets, "eager", torch.device("cpu"), 0.2, True, 120)
    assert r.mode == "eager" and r.samples_per_s > 0 and r.steps >= 1 and r.samples_per_step == 2
    assert r.flops_per_sample > 0 and r.flops_error == ""
    with pytest.raises(TimeoutError, match="cut off after 1 s"):
        measure.model_only_bounded("cosmoflow", "mini", sets, "eager", torch.device("cpu"), 30.0, False, 1.0)
    with pytest.raises(RuntimeError, match="exit 1"):
        measure.model_only_bounded("cosmoflow", "mini", [f"data.root={tmp_path / 'none'}"], "eager",
                                   torch.device("cpu"), 0.2, False, 120)


def test_gpu_check_gives_a_workload_without_a_plan_a_default_one(monkeypatch: pytest.MonkeyPatch) -> None:
    """A workload registered after gpu_check's plans were written (llama31_8b, openfold) is still measured:
    on its mini dataset, at NVIDIA's local batch where a figure exists, and named as a default plan."""
    from benchmarks.gpu_check import plan

    monkeypatch.setattr(plan, "_known", dict)
    p = plan.plan_for("deepcam")
    assert p.default and p.datagen_smoke == p.datagen_full and "--height" in p.datagen_smoke
    assert p.batches_full == (1, 8) and p.batch_smoke == 4 and p.cache == "device"
    assert "no gpu_check plan" in p.note


def test_openfold_step_times_both_parts_and_writes_its_json(tmp_path: Path) -> None:
    out = tmp_path / "of.json"
    proc = bench(["-m", "benchmarks.openfold_step", "--crop", "12", "--clusters", "3", "--extra", "4", "--templates",
                  "2", "--recycles", "1", "--evoformer-blocks", "1", "--modes", "eager", "--repeats", "1",
                  "--threads", "1", "--budget-s", "100", "--json", str(out)])
    assert proc.returncode == 0, proc.stderr[-2000:]
    res = json.loads(out.read_text())
    assert res["results"]["eager"]["parameters"] > 1_000_000 and res["results"]["eager"]["first_step_s"] > 0
    assert "no GPU comparison" in proc.stdout and proc.stdout.splitlines()[-1].startswith("# done in ")
    proc = bench(["-m", "benchmarks.openfold_step", "--part", "evoformer", "--crop", "8", "--clusters", "3",
                  "--templates", "1", "--evoformer-blocks", "1", "--modes", "eager", "--repeats", "2", "--threads",
                  "1", "--budget-s", "60", "--json", str(out)])
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "Evoformer only: 1 block(s) at full width, m (1, 4, 8, 256), z (1, 8, 8, 128)" in proc.stdout
    assert len(json.loads(out.read_text())["results"]["eager"]["steps_s"]) == 2
