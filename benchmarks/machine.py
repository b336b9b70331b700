"""What a benchmark ran on, for the first line of its results (``# ...``) and its JSON: the CPU
model, core count and the instruction-set flags that decide the speed of the data path (CRC-32C,
zlib, bf16 kernels), the torch threads and whether ``crc32c`` uses the hardware instruction."""
from __future__ import annotations

import os
import platform
from pathlib import Path
from typing import Any

FLAGS = ("sse4_2", "pclmulqdq", "avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile")


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
            "load_1min": os.getloadavg()[0]}


def header(info: dict[str, Any]) -> str:
    """The results file's first line."""
    return (f"# {info['cpu']}, {info['cores']} cores, flags {' '.join(info['flags']) or 'none of ' + '/'.join(FLAGS)}; "
            f"crc32c {'hardware' if info['crc32c_hardware'] else 'software'}; torch threads {info['torch_threads']}; "
            f"torch cpu capability {info.get('torch_cpu_capability', '?')}; "
            f"load {info['load_1min']:.2f}")
