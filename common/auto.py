"""Settings chosen for the hardware at start: ``train.precision = "auto"`` and ``train.channels_last = "auto"``.

A speed choice measured on one CPU is not a fact about another: bf16 autocast is fast where the
hardware has bf16 instructions (x86 AVX512_BF16 or AMX, Arm's BF16 extension, CUDA compute
capability >= 8.0) and several times *slower* than fp32 where it is emulated (an AVX2-only x86 CPU:
7.4x slower for the CosmoFlow mini step, issue #16). So

* precision ``auto`` is bf16 only where the hardware does it natively *and* the kernels torch will
  run may use it (``ATEN_CPU_CAPABILITY`` or ``ONEDNN_MAX_CPU_ISA`` can cap them below AVX-512),
  else fp32;
* channels-last ``auto`` is decided by measuring on the CPU (the model's own forward + backward on
  one real batch in both layouts, interleaved, a second or two) and by rule on a GPU (on where the
  tensor cores want NHWC: compute capability >= 7.0 with bf16/fp16); a model without 4-D/5-D
  weights has nothing to lay out.

Each choice keeps its reason; the trainer prints it, logs it in the MLPerf log (non-required keys
``hpcbench_precision`` and ``hpcbench_channels_last``) and ``hpcbench info`` shows it.
"""
from __future__ import annotations

import contextlib
import copy
import os
import platform
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

#: channels-last must beat the default layout by this much to be chosen (probe noise is a few %)
CL_MIN_GAIN = 1.05


@dataclass(frozen=True)
class Choice:
    key: str  # config key, e.g. "train.precision"
    requested: Any  # what the config said ("auto", or an explicit value)
    value: Any  # what the run uses
    reason: str

    def describe(self) -> str:
        how = "auto" if self.requested == "auto" else "set"
        return f"{self.key} = {self.value} ({how}: {self.reason})"

    def log_value(self) -> dict[str, Any]:
        return {"value": self.value, "requested": self.requested, "reason": self.reason}


def _cpu_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return set(value.split())
    return set()


def cpu_bf16_native() -> tuple[bool, str]:
    """(bf16 runs natively on this CPU with the kernels torch will use, why)."""
    machine = platform.machine().lower()
    cap = torch.backends.cpu.get_cpu_capability()
    if machine in ("x86_64", "amd64", "i686", "x86"):
        hw = []
        if getattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False)():
            hw.append("AVX512_BF16")
        if getattr(torch.cpu, "_is_amx_tile_supported", lambda: False)():
            hw.append("AMX")
        if not hw:
            return False, f"this x86 CPU has no bf16 instructions (no AVX512_BF16/AMX; torch CPU capability {cap}), bf16 would be emulated"
        if not cap.startswith("AVX512"):
            return False, (f"the CPU has {'+'.join(hw)} but torch's kernels are capped at {cap} "
                           f"(ATEN_CPU_CAPABILITY={os.environ.get('ATEN_CPU_CAPABILITY', 'unset')}), bf16 would be emulated")
        if not torch.ops.mkldnn._is_mkldnn_bf16_supported():
            return False, (f"the CPU has {'+'.join(hw)} but oneDNN's bf16 kernels are off "
                           f"(ONEDNN_MAX_CPU_ISA={os.environ.get('ONEDNN_MAX_CPU_ISA', 'unset')})")
        return True, f"the CPU has {'+'.join(hw)} (torch CPU capability {cap})"
    if machine in ("aarch64", "arm64"):
        if "bf16" in _cpu_flags():
            return True, f"the Arm CPU has the BF16 extension (torch CPU capability {cap})"
        return False, f"this Arm CPU has no BF16 extension (torch CPU capability {cap}), bf16 would be emulated"
    return False, f"no known native bf16 on a {machine or 'unknown'} CPU"


def gpu_bf16_native(device: torch.device) -> tuple[bool, str]:
    major, minor = torch.cuda.get_device_capability(device)
    name = torch.cuda.get_device_name(device)
    if major >= 8:
        return True, f"{name} has compute capability {major}.{minor} (>= 8.0: bf16 tensor cores)"
    return False, f"{name} has compute capability {major}.{minor} (< 8.0: no native bf16)"


def bf16_native(device: torch.device) -> tuple[bool, str]:
    return gpu_bf16_native(device) if device.type == "cuda" else cpu_bf16_native()


def choose_precision(requested: str, device: torch.device) -> Choice:
    key = "train.precision"
    if requested == "bf16":
        native, why = bf16_native(device)
        if not native:  # kept (the user asked for it), but said: it is the slow case of issue #16
            return Choice(key, requested, requested,
                          f"as configured; WARNING: {why} and is usually several times slower than fp32 here; "
                          "precision auto would pick fp32")
    if requested != "auto":
        return Choice(key, requested, requested, "as configured")
    native, why = bf16_native(device)
    return Choice(key, requested, "bf16" if native else "fp32", why)


def has_conv_weights(model: nn.Module) -> bool:
    return any(p.dim() in (4, 5) for p in model.parameters())


def _layout(batch: Any, channels_last: bool) -> Any:
    from .precision import to_channels_last
    from .step import tree_map

    return tree_map(lambda t: to_channels_last(t) if channels_last else t.contiguous(), batch)


def probe_channels_last(model: nn.Module, batch: Any, loss_fn: Callable[[nn.Module, Any], torch.Tensor],
                        budget_s: float = 2.0, max_rounds: int = 5) -> tuple[float, float]:
    """(best seconds per forward+backward in the default layout, in channels-last) of a copy of
    ``model`` on ``batch``; rounds interleave the two so that load from elsewhere hits both."""
    from .precision import module_to_channels_last

    variants = {}
    for cl in (False, True):
        m = copy.deepcopy(model)
        variants[cl] = (module_to_channels_last(m) if cl else m, _layout(batch, cl))
    best = {False: float("inf"), True: float("inf")}
    with torch.random.fork_rng(devices=[]):  # the probe must not move the run's random streams
        for cl, (m, b) in variants.items():  # warm-up (oneDNN primitive creation)
            loss_fn(m, b).backward()
        t_end = time.perf_counter() + budget_s
        for _ in range(max_rounds):
            for cl, (m, b) in variants.items():
                m.zero_grad(set_to_none=True)
                t0 = time.perf_counter()
                loss_fn(m, b).backward()
                best[cl] = min(best[cl], time.perf_counter() - t0)
            if time.perf_counter() > t_end:
                break
    return best[False], best[True]


def choose_channels_last(requested: bool | str, device: torch.device, model: nn.Module, precision: str,
                         probe: Callable[[], tuple[float, float]] | None) -> Choice:
    """``probe`` (CPU only) returns the timings of :func:`probe_channels_last`; it runs only when
    needed."""
    key = "train.channels_last"
    if requested != "auto":
        return Choice(key, requested, bool(requested), "as configured")
    if not has_conv_weights(model):
        return Choice(key, requested, False, "the model has no 4-D/5-D (convolution) weights")
    if device.type == "cuda":
        major, minor = torch.cuda.get_device_capability(device)
        if major >= 7 and precision in ("bf16", "fp16"):
            return Choice(key, requested, True, f"{precision} convolutions on tensor cores (compute capability "
                                                f"{major}.{minor}) run in NHWC")
        return Choice(key, requested, False, f"{precision} on compute capability {major}.{minor}: no tensor-core layout to match")
    if probe is None:
        return Choice(key, requested, False, "not measured")
    plain, cl = probe()
    gain = plain / cl if cl > 0 else 0.0
    use = gain >= CL_MIN_GAIN
    return Choice(key, requested, use, f"measured here: channels-last step {gain:.2f}x the default layout's speed "
                                       f"({1e3 * cl:.1f} vs {1e3 * plain:.1f} ms, {precision}); "
                                       f"chosen only at >= {CL_MIN_GAIN:.2f}x")


def autocast_loss(forward_loss: Callable[[nn.Module, Any], torch.Tensor], precision: str,
                  device: torch.device) -> Callable[[nn.Module, Any], torch.Tensor]:
    """``forward_loss`` under the autocast of ``precision`` (fp32: none)."""
    def fn(model: nn.Module, batch: Any) -> torch.Tensor:
        ctx = (torch.autocast(device.type, dtype=torch.bfloat16 if precision == "bf16" else torch.float16)
               if precision in ("bf16", "fp16") else contextlib.nullcontext())
        with ctx:
            return forward_loss(model, batch).float()
    return fn


def describe_device_rules(device: torch.device) -> dict[str, str]:
    """What ``auto`` gives on ``device`` (for ``hpcbench info``)."""
    native, why = bf16_native(device)
    out = {"precision auto": f"{'bf16' if native else 'fp32'}: {why}"}
    if device.type == "cuda":
        major, _ = torch.cuda.get_device_capability(device)
        out["channels_last auto"] = ("on for convolution models in bf16/fp16 (tensor cores)" if major >= 7
                                     else "off (no tensor cores)")
    else:
        out["channels_last auto"] = ("measured at the start of each run on the model and one batch "
                                     f"(on only if >= {CL_MIN_GAIN:.2f}x faster)")
    return out
