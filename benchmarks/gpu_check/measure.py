"""The measurements of the GPU check, one function each: the GEMM peak, a workload's training step alone
(samples/s and FLOPs per sample), and ``hpcbench train`` end to end from the files (every epoch through
the loader) or from ``data.cache`` (the epochs after the first)."""
from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class StepRate:
    mode: str
    samples_per_s: float
    steps: int
    samples_per_step: int
    flops_per_sample: float = 0.0  # counted by FlopCounterMode on one eager step (0: not counted)
    flops_error: str = ""  # why the FLOPs could not be counted


@dataclass
class EndToEnd:
    cache: str
    per_epoch: list[float] = field(default_factory=list)
    status: str = "ok"
    # ms per step over the epochs after the first (the harness's epoch_phases of instance 0's leader): waiting for
    # the loader, the step as the host sees it, and the rest of the epoch's training time (the harness's per-step
    # work, the epoch's start, the device queue drained at its end); empty when the run wrote no summary
    per_step_ms: dict[str, float] = field(default_factory=dict)

    @property
    def rate(self) -> float:
        """Mean of the epochs after the first (the first compiles / captures, and fills a cache)."""
        later = self.per_epoch[1:] or self.per_epoch
        return sum(later) / len(later) if later else 0.0


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def gemm_peak(device: torch.device, seconds: float = 2.0, warmup_s: float = 1.0) -> tuple[float, str]:
    """(FLOP/s, what was measured): the bf16 8192^3 GEMM on a GPU, timed after ``warmup_s`` of the same
    products (an idle H200 sits at 345 MHz: three warm-up products measured 460 TFLOP/s where a warm GPU
    gives 670-790); on a CPU the time-bounded peak of :func:`benchmarks.machine.matmul_peak` in the dtype
    that is native there."""
    if device.type != "cuda":
        from benchmarks.machine import matmul_peak, peak_dtype

        dtype = peak_dtype()
        flops, n = matmul_peak(dtype, seconds=min(seconds, 1.0))
        return flops, f"{str(dtype).removeprefix('torch.')} GEMM {n}^3 on the CPU"
    n = 8192
    a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    t = time.perf_counter()
    while time.perf_counter() - t < warmup_s:
        for _ in range(10):
            a @ b
        sync(device)
    reps, t = 0, time.perf_counter()
    while reps < 10 or time.perf_counter() - t < seconds:
        for _ in range(10):
            a @ b
        reps += 10
        sync(device)
    return 2 * n**3 * reps / (time.perf_counter() - t), f"bf16 GEMM {n}^3"


def load_workload(name: str, preset: str, overrides: list[str]) -> Any:
    from hpcbench import registry

    cls = registry.get(name)
    return cls(cls.load_config(preset, overrides))


def build_step(wl: Any, mode: str, device: torch.device) -> Any:
    """The harness's training step for ``wl`` on one device, built as :mod:`hpcbench.common.build` builds it
    for one rank: "auto" precision and channels-last resolved (no CPU probe) into ``wl.cfg`` and the dataset
    spec, model-parallel and sparse-gradient parameters kept as the trainer keeps them, the benchmark's
    optimizer with its weight-decay exemptions."""
    from hpcbench.common.auto import choose_channels_last, choose_precision
    from hpcbench.common.flat import FlatParams
    from hpcbench.common.optim import build_optimizer
    from hpcbench.common.precision import Precision, module_to_channels_last
    from hpcbench.common.schedule import Schedule
    from hpcbench.common.step import TrainStep

    torch.manual_seed(0)
    cfg, tc = wl.cfg, wl.cfg.train
    model = wl.build_model().to(device)
    tc.precision = choose_precision(tc.precision, device).value
    tc.channels_last = choose_channels_last(tc.channels_last, device, model, tc.precision, None).value
    if tc.channels_last:
        model = module_to_channels_last(model)
    spec = wl.dataset()
    if hasattr(spec, "channels_last"):
        spec.channels_last = tc.channels_last
    flat = FlatParams(model, wl.local_parameters(model), wl.sparse_parameters(model))
    opt = build_optimizer(flat, cfg.optim, 1, 0, allow_apex=tc.precision != "fp16",
                          decay_exempt=[wl.no_weight_decay(n) for n in flat.names])
    schedule = Schedule.from_config(cfg.optim, steps_per_epoch=100, max_epochs=tc.max_epochs)
    return TrainStep(wl, model, flat, opt, schedule, Precision(tc.precision, device), mode,
                     accum=getattr(tc, "grad_accum", 1))


def first_batch(wl: Any, device: torch.device) -> Any:
    """One training batch of ``wl``'s files (its loader's batch size, or every sample where there are fewer),
    on ``device`` in the layout ``wl.cfg`` holds (call :func:`build_step` first: it resolves "auto")."""
    from hpcbench.common.step import prepare_batch

    spec = wl.dataset()
    source = spec.open(wl.data_root(), spec.train_split)
    spec.start(source)
    host = spec.model_batch(source, min(wl.loader_batch_size(), len(source)))
    return prepare_batch(host, device, wl.cfg.train.channels_last)


def model_only(name: str, preset: str, overrides: list[str], mode: str, device: torch.device, seconds: float,
               count_flops: bool) -> StepRate:
    """The harness's training step alone, repeated on one batch of the files already on the device, for
    about ``seconds`` after three warm-up steps (which include compilation or graph capture); then, with
    ``count_flops``, one more step under ``FlopCounterMode`` for the FLOPs per sample."""
    wl = load_workload(name, preset, overrides)
    step = build_step(wl, mode, device)  # first: it resolves "auto" precision / channels-last into wl.cfg
    batch = first_batch(wl, device)
    samples = wl.batch_size(batch)
    for _ in range(3):
        step(batch)
    sync(device)
    steps, chunk, t = 0, 1, time.perf_counter()
    loss = torch.zeros((), device=device)
    while True:
        for _ in range(chunk):
            loss += step(batch)
        steps += chunk
        sync(device)
        spent = time.perf_counter() - t
        if spent >= seconds or steps >= 10_000:
            break
        chunk = min(chunk * 2, max(1, int(steps * (seconds - spent) / max(spent, 1e-9))))
    float(loss)
    rate = samples * steps / (time.perf_counter() - t)
    # after the timing, so that the counter's dispatch overhead and its hooks stay out of the timed steps
    flops, why = count_flop(step, batch, samples) if count_flops else (0.0, "")
    return StepRate(mode, rate, steps, samples, flops, why)


def model_only_bounded(name: str, preset: str, overrides: list[str], mode: str, device: torch.device,
                       seconds: float, count_flops: bool, timeout: float) -> StepRate:
    """:func:`model_only` in a child process that is killed after ``timeout`` seconds: compilation cannot
    be interrupted in the process that compiles (DeepCAM's took over 3 minutes on an H200 and ran the
    whole check past its device call), and a budget must hold. Raises ``TimeoutError`` when cut off, and
    ``RuntimeError`` with the child's last line when it fails."""
    args = json.dumps({"name": name, "preset": preset, "overrides": overrides, "mode": mode,
                       "device": str(device), "seconds": seconds, "count_flops": count_flops})
    cmd = [sys.executable, "-m", "benchmarks.gpu_check.measure", args]
    try:
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=max(1.0, timeout))
    except subprocess.TimeoutExpired:
        raise TimeoutError(f"cut off after {timeout:.0f} s (warm-up and compilation included)") from None
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(RESULT)]
    if proc.returncode or not lines:
        raise RuntimeError(f"exit {proc.returncode}: {failure(proc.stderr + proc.stdout)}")
    return StepRate(**json.loads(lines[-1][len(RESULT):]))


RESULT = "gpu_check.model_only "  # the child's line that carries its StepRate


def _child(argv: list[str]) -> int:
    a = json.loads(argv[0])
    r = model_only(a["name"], a["preset"], a["overrides"], a["mode"], torch.device(a["device"]), a["seconds"],
                   a["count_flops"])
    print(RESULT + json.dumps(asdict(r)), flush=True)
    return 0


def count_flop(step: Any, batch: Any, samples: int) -> tuple[float, str]:
    """(FLOPs per sample of one training step counted by ``FlopCounterMode``, ""), or (0, why) where no
    counter can follow the step. ``FlopCounterMode``'s module tracker puts backward hooks on the step's
    tensors that ``autograd.grad`` refuses (OC20's forces); such a step is counted again by
    :class:`RegistryFlops`, the same per-op formulas without the tracker."""
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    try:
        with counter:
            step(batch)
        return counter.get_total_flops() / max(1, samples), ""
    except RuntimeError as exc:
        first = f"FlopCounterMode failed on this step: {str(exc).splitlines()[0][:200]}"
    plain = RegistryFlops()
    try:
        with plain:
            step(batch)
    except RuntimeError as exc:
        return 0.0, f"{first}; without its module tracker: {str(exc).splitlines()[0][:200]}"
    return plain.total / max(1, samples), ""


class RegistryFlops(TorchDispatchMode):
    """FLOPs of every aten op that torch's flop registry has a formula for (matmuls, convolutions,
    attention), counted at dispatch, forward and backward, with no module hooks."""

    def __init__(self) -> None:
        super().__init__()
        self.total = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        from torch.utils.flop_counter import flop_registry

        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        formula = flop_registry.get(func._overloadpacket)
        if formula is not None:
            self.total += int(formula(*args, **kwargs, out_val=out))
        return out


def failure(output: str) -> str:
    """The line of ``hpcbench train``'s output that says why it failed (a named error), else its last line."""
    lines = [ln.strip() for ln in output.splitlines() if ln.strip()]
    named = [ln for ln in lines if "error:" in ln.lower()]
    return (named[0] if named else lines[-1] if lines else "no output")[:400]


def per_step_split(summaries: list[Path]) -> dict[str, float]:
    """Where an epoch's training time goes, in ms per step over the epochs after the first (all of them when
    there is one): ``data_wait``, ``step`` (host side) and ``rest``, from the epoch_phases of instance 0 in the
    job's ``train_summary.json``; {} when there is no summary or it holds no phases."""
    if not summaries:
        return {}
    rows = json.loads(summaries[0].read_text())
    result = next((r.get("result") for r in rows if r.get("instance") == 0), None) or {}
    phases = result.get("epoch_phases") or []
    later = phases[1:] or phases
    steps = sum(p["steps"] for p in later)
    if not steps:
        return {}
    seconds, wait, step = (sum(p[k] for p in later) for k in ("seconds", "data_wait_s", "step_s"))
    return {"steps": float(steps), "data_wait": 1e3 * wait / steps, "step": 1e3 * step / steps,
            "rest": 1e3 * (seconds - wait - step) / steps}


def end_to_end(name: str, preset: str, overrides: list[str], mode: str, cache: str, device: str, epochs: int,
               timeout: float) -> EndToEnd:
    """``hpcbench train`` on the files: the tracked throughput of each epoch (training time only, the
    evaluation excluded). ``cache`` none: every epoch reads the files through the loader and copies
    each batch to the device; host/device: epoch 1 fills the cache, the later ones read from it."""
    from hpcbench.report.logs import parse_log

    sets = [*overrides, "train.loader=torch", f"train.graph={mode}", f"data.cache={cache}", "train.division=open",
            f"train.max_epochs={epochs}", "train.max_steps=0", f"train.eval_every={epochs}", "train.eval_start=0",
            "train.eval_offset=0", "train.eval_every_samples=0", "train.checkpoint_every=0"]
    out = EndToEnd(cache)
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
        cmd = [sys.executable, "-m", "hpcbench", "train", name, "--config", preset, "--device", device,
               "--results", tmp, "--no-progress"]
        for kv in sets:
            cmd += ["--set", kv]
        try:
            proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            out.status = f"cut off after {timeout:.0f} s"
            return out
        logs = sorted(Path(tmp).glob("results/**/result_*.txt"))
        out.per_epoch = [tp for tp, _ms in parse_log(logs[0]).tracked_throughput] if logs else []
        out.per_step_ms = per_step_split(sorted(Path(tmp).rglob("train_summary.json")))
        # exit 4: stopped at max_epochs without reaching the quality target, as intended here
        if proc.returncode not in (0, 4) or not out.per_epoch:
            out.status = f"failed (exit {proc.returncode}): {failure(proc.stdout + proc.stderr)}"
    return out


if __name__ == "__main__":
    raise SystemExit(_child(sys.argv[1:]))
