"""A staging-time model: how long packed, ``independent`` (packed shards, no sharded reads) and ``copy`` (raw
files: the v1.0 way) take for a layout.

Per job of K instances of n nodes (N = K*n; several instances per node: n = 1 and every node needs
the whole dataset), for a dataset of R raw bytes that packs into P bytes. Every node needs R/n raw
bytes on its local disk. The K nodes that need the same shard-set form a group (G = K, or N when
instances share nodes).

==============  ============================  =====================  ============  =============
method          read from the shared FS       per node fabric in     decompress    local write
==============  ============================  =====================  ============  =============
packed          P (once)                      P/n * (G-1)/G          R/n           R/n
independent     G * P (each node its set)     0                      R/n           R/n
copy            G * R (each node its files)   0                      0             R/n
==============  ============================  =====================  ============  =============

Read time = max(job bytes / shared-FS bandwidth, node bytes / per-node client limit). The phases are
pipelined in U units (Allgatherv rounds of ``chunk_bytes`` per reader; copy: the node's files), so
the body takes (sum of the stages + (U-1) x the slowest stage) / U: the slowest stage when U is large
(a cluster staging terabytes), nearly the sum when a node's stream is a round or two. Where nodes are
emulated on one host (``shared_cpu``), decompression, local writes and the fabric (shared-memory
copies) use the same cores and form one stage (their times add up). ``overhead_s`` is the fixed cost
before the first byte moves (manifest, plan, folder checks). Rates are GB/s (1e9 bytes/s);
decompression counts output bytes.

CPU contention: a node's local rates come from per-thread rates as ``node_rate(thread_GBps, threads,
cores_per_node)`` = thread rate x min(threads, cores): on a cluster every node has its own cores; where
P emulated nodes share a host of C usable cores, each gets C/P of them.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

GB = 1e9
METHODS = ("packed", "independent", "copy")


@dataclass(frozen=True)
class System:
    fs_GBps: float  # shared filesystem: aggregate read bandwidth, shared by every reader
    fabric_GBps: float  # per node, into the node (Allgatherv)
    write_GBps: float  # per node, node-local storage
    decompress_GBps: float  # per node, all its threads (output bytes)
    client_GBps: float = math.inf  # per node read limit from the shared FS
    overhead_s: float = 0.0
    shared_cpu: bool = False  # nodes emulated on one host: decompress + write + fabric add up
    chunk_bytes: float = 0.0  # pipelining unit (Allgatherv round per reader); 0: perfectly pipelined

    def __post_init__(self) -> None:
        for k in ("fs_GBps", "fabric_GBps", "write_GBps", "decompress_GBps", "client_GBps"):
            v = getattr(self, k)
            if not v > 0 or math.isnan(v):
                raise ValueError(f"{k} must be > 0, got {v}")
        for k in ("overhead_s", "chunk_bytes"):
            v = getattr(self, k)
            if not (v >= 0 and math.isfinite(v)):
                raise ValueError(f"{k} must be a finite number >= 0, got {v}")


def node_rate(thread_GBps: float, threads: int, cores_per_node: float) -> float:
    """A node's rate from one thread's: its threads run in parallel up to the cores it has (a
    fraction of a core when emulated nodes share a host: cores / nodes on the host)."""
    if not (thread_GBps > 0 and threads >= 1 and cores_per_node > 0):
        raise ValueError(f"need thread_GBps > 0, threads >= 1, cores_per_node > 0; got {thread_GBps}, "
                         f"{threads}, {cores_per_node}")
    return thread_GBps * min(threads, cores_per_node)


def pipelined(stages: list[float], units: int) -> float:
    """Time of a pipeline of these total stage times cut into ``units`` equal units: fill and drain
    cost one unit of every stage, the rest runs at the slowest stage's pace."""
    if not stages:
        return 0.0
    u = max(1, units)
    return (sum(stages) + (u - 1) * max(stages)) / u


@dataclass(frozen=True)
class Layout:
    nodes: int
    instances: int

    def shape(self) -> tuple[int, int]:
        """(n nodes per instance's shard-sets, G nodes sharing each set); a ValueError if unstageable."""
        if self.nodes < 1 or self.instances < 1:
            raise ValueError(f"nodes and instances must be >= 1, got {self.nodes} and {self.instances}")
        if self.instances > self.nodes:
            if self.instances % self.nodes:
                raise ValueError(f"instances {self.instances} is not a multiple of nodes {self.nodes}")
            return 1, self.nodes
        if self.nodes % self.instances:
            raise ValueError(f"nodes {self.nodes} is not a multiple of instances {self.instances}")
        return self.nodes // self.instances, self.instances


@dataclass
class Prediction:
    method: str
    shared_read_bytes: float
    phases: dict[str, float] = field(default_factory=dict)  # seconds: read, fabric, decompress, write
    total_s: float = 0.0

    def bottleneck(self) -> str:
        return max(self.phases, key=lambda k: self.phases[k])


def _units(method: str, node_read: float, files_per_node: float, chunk: float) -> int:
    """How many pieces a node's work is pipelined in: copy streams file by file; packed and independent
    move one ``chunk`` per reader per round. Without a chunk (0): many (perfectly pipelined)."""
    if method == "copy":
        return max(1, math.ceil(files_per_node)) if files_per_node else 1 << 30
    if not chunk:
        return 1 << 30
    return max(1, math.ceil(node_read / chunk))


def predict(raw_bytes: float, packed_bytes: float, lay: Layout, sys_: System, method: str,
            files: int = 0) -> Prediction:
    """Predicted phase times and total for one method (see the module docstring for the arithmetic);
    ``files``: the dataset's file count (copy's pipelining unit; 0: many)."""
    if method not in METHODS:
        raise ValueError(f"method must be one of {', '.join(METHODS)}, got {method!r}")
    if raw_bytes < 0 or packed_bytes < 0:
        raise ValueError(f"sizes must be >= 0, got raw {raw_bytes} and packed {packed_bytes}")
    n, g = lay.shape()
    per_node_raw, per_node_packed = raw_bytes / n, packed_bytes / n
    files_per_node = files / n
    if method == "packed":
        job_read, node_read = packed_bytes, packed_bytes / (n * g)
        fabric = per_node_packed * (g - 1) / g
    elif method == "independent":
        job_read, node_read, fabric = g * packed_bytes, per_node_packed, 0.0
    else:
        job_read, node_read, fabric = g * raw_bytes, per_node_raw, 0.0
    ph = {
        "read": max(job_read / (sys_.fs_GBps * GB), node_read / (sys_.client_GBps * GB)),
        "fabric": fabric / (sys_.fabric_GBps * GB),
        "decompress": 0.0 if method == "copy" else per_node_raw / (sys_.decompress_GBps * GB),
        "write": per_node_raw / (sys_.write_GBps * GB),
    }
    local = [ph["fabric"], ph["decompress"], ph["write"]]
    stages = [ph["read"], sum(local)] if sys_.shared_cpu else [ph["read"], *local]
    body = pipelined(stages, _units(method, node_read, files_per_node, sys_.chunk_bytes))
    return Prediction(method, job_read, ph, sys_.overhead_s + body)


def predict_all(raw_bytes: float, packed_bytes: float, lay: Layout, sys_: System) -> dict[str, Prediction]:
    return {m: predict(raw_bytes, packed_bytes, lay, sys_, m) for m in METHODS}


def weak_scaling(raw_bytes: float, packed_bytes: float, nodes_per_instance: int, instances: list[int],
                 sys_: System) -> dict[str, list[float]]:
    """Total time per method for each instance count K (N = K * nodes_per_instance): the scaling curve."""
    return {m: [predict(raw_bytes, packed_bytes, Layout(k * nodes_per_instance, k), sys_, m).total_s
                for k in instances] for m in METHODS}


def format_table(preds: dict[str, Prediction]) -> str:
    lines = [f"{'method':>12} {'shared read GB':>14} {'read s':>9} {'fabric s':>9} {'decomp s':>9} "
             f"{'write s':>9} {'total s':>9}  bottleneck"]
    for m, p in preds.items():
        ph = p.phases
        lines.append(f"{m:>12} {p.shared_read_bytes / GB:>14,.2f} {ph['read']:>9.2f} {ph['fabric']:>9.2f} "
                     f"{ph['decompress']:>9.2f} {ph['write']:>9.2f} {p.total_s:>9.2f}  {p.bottleneck()}")
    return "\n".join(lines)
