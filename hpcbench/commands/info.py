"""`hpcbench info`: what this installation and this job look like."""
from __future__ import annotations

import argparse
import importlib
import json
import os
import platform
import sys
from typing import Any

from hpcbench.common.system import cpu_model
from hpcbench import __version__

from ._common import add_device_arg, add_layout_args

PACKAGES = ("torch", "numpy", "mpi4py", "h5py", "zstandard", "lmdb", "mlperf_logging", "torch_geometric", "ase")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_layout_args(parser)
    add_device_arg(parser)
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")


def _version(name: str) -> str:
    try:
        from importlib.metadata import version

        return version(name.replace("_", "-"))
    except Exception:  # noqa: BLE001 - any failure means "not installed" for this report
        try:
            return getattr(importlib.import_module(name), "__version__", "installed")
        except Exception:  # noqa: BLE001
            return "not installed"


def _dali() -> str:
    try:
        import nvidia.dali as dali

        return f"{dali.__version__} (CPU pipelines; GPU ops need CUDA)"
    except Exception as exc:  # noqa: BLE001
        return f"not available ({type(exc).__name__}: {exc})"


def _apex() -> str:
    try:
        import apex  # noqa: F401
        import torch

        return "importable" + ("" if torch.cuda.is_available() else " but no CUDA: not used")
    except Exception:  # noqa: BLE001
        return "not importable (project implementations used)"


def _devices() -> dict[str, Any]:
    import torch

    out: dict[str, Any] = {"cuda_available": torch.cuda.is_available(), "gpus": []}
    if torch.cuda.is_available():
        out["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        out["cuda"] = torch.version.cuda
        out["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
    return out


def run(args: argparse.Namespace) -> int:
    from hpcbench.common.dist import choose_device, default_threads, device_description, init_distributed, launched_by_mpi, mpi
    from hpcbench.common.errors import DistributedError

    env = init_distributed(args.instances, args.ranks_per_node, torch_backend=None)
    layout = env.layout
    # the device `hpcbench train --device` would give each rank (the same choice, no process group); a
    # refusal (raised alike on every rank) is shown with the layout it refuses, and the exit status is 2
    refused: str | None = None
    try:
        described = device_description(choose_device(env, args.device))
    except DistributedError as exc:
        refused = str(exc)
        described = {"device": "refused", "gpu_name": None, "pci_bus_id": None, "cuda_visible_devices": None}
    rows = env.comm.gather({**layout.__dict__, "pid": os.getpid(), **described}, root=0)
    if not layout.is_world_leader:
        return 2 if refused else 0

    import torch

    from hpcbench.common.auto import describe_device_rules

    MPI = mpi()
    report: dict[str, Any] = {
        "hpcbench": __version__,
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "packages": {name: _version(name) for name in PACKAGES},
        "mpi_library": MPI.Get_library_version().strip().splitlines()[0],
        "mpi_standard": "{}.{}".format(*MPI.Get_version()),
        "launched_by_mpi": launched_by_mpi(),
        "dali": _dali(),
        "apex": _apex(),
        "devices": _devices(),
        "torch_threads_per_rank": default_threads(layout.host_local_size),
        "ranks": layout.world_size,
        "nodes": layout.num_nodes,
        "instances": layout.num_instances,
        "ranks_per_instance": layout.instance_size,
        "nodes_per_instance": layout.nodes_per_instance,
        "device_choice": {"requested": args.device, "error": refused},
        "cpu": {"capability": torch.backends.cpu.get_cpu_capability(), "model": cpu_model()},
        "auto": {} if refused else describe_device_rules(torch.device(described["device"])),
        "layout": rows,
    }
    if args.json:
        print(json.dumps(report, indent=2, default=str))
    else:
        _print_table(report, torch.get_num_threads())
    if refused:
        print(f"hpcbench info: error: {refused}", file=sys.stderr)
        return 2
    return 0


def _print_table(report: dict[str, Any], threads_now: int) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    t = Table(title=f"hpcbench {report['hpcbench']}", show_header=False)
    t.add_row("python", report["python"])
    t.add_row("platform", report["platform"])
    for name, version in report["packages"].items():
        t.add_row(name, version)
    t.add_row("MPI library", report["mpi_library"])
    t.add_row("MPI standard", report["mpi_standard"])
    t.add_row("DALI", report["dali"])
    t.add_row("apex", report["apex"])
    dev = report["devices"]
    t.add_row("devices", ", ".join(dev["gpus"]) if dev["gpus"] else "CPU only (no CUDA device)")
    choice = report["device_choice"]
    t.add_row("--device " + choice["requested"], f"REFUSED: {choice['error']}" if choice["error"] else "ok")
    t.add_row("CPU", f"{report['cpu']['model']} (torch CPU capability {report['cpu']['capability']})")
    for key, choice in report["auto"].items():
        t.add_row(key, choice)
    t.add_row("torch threads / rank", f"{report['torch_threads_per_rank']} (process default {threads_now})")
    t.add_row("ranks", str(report["ranks"]))
    t.add_row("nodes", str(report["nodes"]))
    t.add_row("instances", f"{report['instances']} x {report['ranks_per_instance']} ranks "
              f"({report['nodes_per_instance']} node(s) each)")
    console.print(t)
    lt = Table(title="rank layout (device: what `hpcbench train --device` gives each rank)")
    rows = report["layout"]
    gpus = any(r["device"].startswith("cuda") for r in rows)
    # the rank on the physical host picks the GPU; shown when nodes are emulated (it differs from "local")
    emulated = any((r["host_local_rank"], r["host_local_size"]) != (r["local_rank"], r["local_size"]) for r in rows)
    cols = ["rank", "host", "node", "local"] + (["host rank"] if emulated else []) + ["inst", "inst rank", "inst node",
                                                                                      "device"]
    for col in cols + (["GPU", "PCI bus id"] if gpus else []):
        lt.add_column(col, justify="right")
    for r in rows:
        row = [str(r["world_rank"]), r["hostname"], str(r["node_index"]), f"{r['local_rank']}/{r['local_size']}"]
        row += [f"{r['host_local_rank']}/{r['host_local_size']}"] if emulated else []
        row += [str(r["instance"]), f"{r['instance_rank']}/{r['instance_size']}", str(r["instance_node_index"]),
                r["device"]]
        row += [r["gpu_name"] or "", r["pci_bus_id"] or "n/a"] if gpus else []
        lt.add_row(*row)
    console.print(lt)
