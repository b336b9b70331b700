"""What a benchmark ran on, for the first line of its results (``# ...``) and its JSON: the CPU
model, core count and the instruction-set flags that decide the speed of the data path (CRC-32C,
zlib, bf16 kernels), the torch threads, whether ``crc32c`` uses the hardware instruction and whether
bf16 is native here, the transparent-hugepage setting (it decides what a fresh multi-MiB buffer
costs in page faults) and the load averages (a shared box's figures depend on them); plus a cheap,
time-bounded GEMM peak to compare achieved FLOP/s with."""
from __future__ import annotations

import os
import platform
import time
from pathlib import Path
from typing import Any

FLAGS = ("sse4_2", "pclmulqdq", "vpclmulqdq", "avx2", "avx512f", "avx512bw", "avx512_bf16", "amx_bf16", "amx_tile")
THP = Path("/sys/kernel/mm/transparent_hugepage/enabled")


def transparent_hugepages(path: Path = THP) -> str:
    """The selected transparent-hugepage mode (``always``, ``madvise`` or ``never``: the bracketed word of
    ``path``), or why it is unknown."""
    try:
        text = path.read_text()
    except OSError as exc:
        return f"unknown ({path}: {exc.strerror or exc})"
    start, end = text.find("["), text.find("]")
    return text[start + 1:end] if 0 <= start < end else f"unknown ({path}: {text.strip()!r})"


def describe() -> dict[str, Any]:
    model, flags = platform.processor() or "unknown", set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name":
                model = value.strip()
            elif key.strip() == "flags":
                flags = set(value.split())
    except OSError:
        pass
    import crc32c
    import torch

    return {"cpu": model, "cores": os.cpu_count(), "flags": [f for f in FLAGS if f in flags],
            "torch_threads": torch.get_num_threads(), "crc32c_hardware": bool(crc32c.hardware_based),
            "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "bf16_native": bf16_native()[0], "load_1min": os.getloadavg()[0],
            "load_avg": list(os.getloadavg()), "transparent_hugepage": transparent_hugepages()}


def header(info: dict[str, Any]) -> str:
    """The results file's first line."""
    return (f"# {info['cpu']}, {info['cores']} cores, flags {' '.join(info['flags']) or 'none of ' + '/'.join(FLAGS)}; "
            f"crc32c {'hardware' if info['crc32c_hardware'] else 'software'}; torch threads {info['torch_threads']}; "
            f"torch cpu capability {info.get('torch_cpu_capability', '?')}; "
            f"bf16 {'native' if info.get('bf16_native') else 'emulated'}; "
            f"transparent hugepages {info.get('transparent_hugepage', '?')}; "
            f"load {' / '.join(f'{x:.2f}' for x in info.get('load_avg', [info['load_1min']]))} (1/5/15 min)")


def _local_cpu_bf16_native() -> tuple[bool, str]:
    """The check of ``hpcbench.common.auto.cpu_bf16_native`` for trees that do not have it yet (x86 only;
    elsewhere bf16 counts as emulated, which errs on the cheap side)."""
    import torch

    cap = torch.backends.cpu.get_cpu_capability()
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return False, f"no native-bf16 check for a {platform.machine()} CPU here (torch CPU capability {cap})"
    hw = [name for name, fn in (("AVX512_BF16", "_is_avx512_bf16_supported"), ("AMX", "_is_amx_tile_supported"))
          if getattr(torch.cpu, fn, lambda: False)()]
    if not hw:
        return False, f"no AVX512_BF16/AMX on this CPU (torch CPU capability {cap}): bf16 is emulated"
    if not cap.startswith("AVX512"):
        return False, f"the CPU has {'+'.join(hw)} but torch's kernels are capped at {cap}: bf16 is emulated"
    if not torch.ops.mkldnn._is_mkldnn_bf16_supported():
        return False, f"the CPU has {'+'.join(hw)} but oneDNN's bf16 kernels are off: bf16 is emulated"
    return True, f"the CPU has {'+'.join(hw)} (torch CPU capability {cap})"


def bf16_native(device: Any = None) -> tuple[bool, str]:
    """(bf16 runs natively on ``device`` (default: the CPU), why): ``hpcbench.common.auto``'s answer when the
    tree has it, else the same check made here."""
    try:
        from hpcbench.common import auto
    except ImportError:
        auto = None
    if device is not None and getattr(device, "type", device) == "cuda":
        import torch

        major, minor = torch.cuda.get_device_capability(device)
        return major >= 8, f"{torch.cuda.get_device_name(device)} has compute capability {major}.{minor}"
    return auto.cpu_bf16_native() if auto is not None else _local_cpu_bf16_native()


def peak_dtype(device: Any = None) -> Any:
    """The dtype a FLOP reference should be measured in: bf16 where it is native, else fp32 (an
    emulated bf16 GEMM is no peak of anything, and at n=2048 it takes minutes on an AVX2 CPU)."""
    import torch

    return torch.bfloat16 if bf16_native(device)[0] else torch.float32


def matmul_peak(dtype: Any, seconds: float = 1.0, max_n: int = 2048, device: Any = "cpu") -> tuple[float, int]:
    """(best FLOP/s of an n x n GEMM, n): n doubles from 256 while the next size should take under a
    quarter of ``seconds``, then products repeat until ``seconds`` pass (at most 5): bounded by time
    on any machine, whatever the dtype costs there."""
    import torch

    dev = torch.device(device)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    deadline = time.perf_counter() + seconds

    def once(a: torch.Tensor, b: torch.Tensor) -> float:
        sync()
        t = time.perf_counter()
        a @ b
        sync()
        return time.perf_counter() - t

    n, best = 256, 0.0
    while True:
        a, b = torch.randn(n, n, dtype=dtype, device=dev), torch.randn(n, n, dtype=dtype, device=dev)
        once(a, b)  # warm-up
        dt = min(once(a, b), once(a, b))  # two: one slow product (load elsewhere) must not stop the growth
        best = max(best, 2.0 * n**3 / dt)
        if 2 * n > max_n or 8 * dt > seconds / 4 or time.perf_counter() > deadline:
            break
        n *= 2
    for _ in range(4):
        if time.perf_counter() > deadline:
            break
        best = max(best, 2.0 * n**3 / once(a, b))
    return best, n
