"""Loader rate vs the machine's own limit, at full shapes, measured in the same run.

For CosmoFlow (128^3 x 4 int16; plain and gzip TFRecords) and DeepCAM (768 x 1152 x 16 float32 +
labels), this prints the training loader's samples/s and decoded bytes/s, in total and per core,
with ``data.threads = 0`` (one core: the caller reads) and with N reader threads (per core = total
/ N), next to the limit measured the same way (the same files, the same parallelism):

  (a) plain TFRecords: each file read from the page cache into one reused buffer and its CRC-32C
      taken (the ``crc32c`` package, hardware when ``crc32c_hardware``), the fastest way to read
      and check the bytes at all;
  (b) gzip TFRecords: the file read and inflated by ``zlib.decompress`` into its final size
      (zlib's own rate; it checks the gzip CRC-32 itself). Both sides allocate here: the loader,
      like this limit, reads the file into fresh bytes and inflates into a fresh buffer (Python's
      zlib cannot inflate into a given one), then copies ``x`` into its reused batch buffer;
  (c) DeepCAM, the loader's own HDF5 read without its checks: ``read_direct`` of ``climate/data``
      and ``climate/labels_0`` into two reused arrays (h5py opens and parses each file);
  (d) DeepCAM, the raw read of the dataset bytes: the two datasets' contiguous extents (their
      offsets and sizes, found once before timing) read by ``os.preadv`` into one reused buffer, no
      HDF5 at all; the judged limit. A dataset that is not stored contiguously (chunked,
      compressed) has no raw extent: (c) is judged then, and the line says so.

Every limit and every loader writes into reused numpy buffers (the loader's batch buffers come back
to it once a batch is dropped), so neither side pays page faults or page sizes the other does not,
except where both allocate alike (b).

The loader is measured on its host output in the storage dtype (read + validate + batch: int16
counts, float32 data + uint8 labels), which is what crosses to a GPU, where the spec's transform
(log1p; normalization) runs; ``+cpu transform`` adds that transform in the reader thread, as when
training on the CPU (for information; the transform writes into reused outputs as well). Goals:
CosmoFlow plain >= 80% of (a) per core, gzip >= 80% of (b), DeepCAM >= 80% of (d). With CUDA, the training step's samples/s (the harness's step,
bf16 channels-last, on a batch from the loader) is printed beside them; DALI, when installed, is
shown with its transform. The page cache is warmed first (every file read once), so the rates are
CPU costs, not the disk's. Rounds interleave every measurement; the tables show each one's best
round, and the goals are judged on the median over rounds of the loader / limit ratio measured
within one round. Each
measurement is printed when it is made; ``--budget-s`` bounds the whole run (datagen gets the time
left as its timeout; rounds and datasets the budget does not reach are skipped and said).

  python -m benchmarks.loader_limit --work /tmp/ll      # writes the datasets there when missing:
  python -m hpcbench datagen cosmoflow --out /tmp/ll/cf-plain --samples 48 --val-samples 1 --size 128 --plain
  python -m hpcbench datagen cosmoflow --out /tmp/ll/cf-gzip --samples 48 --val-samples 1 --size 128
  python -m hpcbench datagen deepcam --out /tmp/ll/dc --samples 12 --eval-samples 1 --height 768 --width 1152
(48 CosmoFlow samples: 785 MiB plain, 142 MiB gzip; 12 DeepCAM samples: 660 MiB; fits a 2-core 24 GiB box.)
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
import zlib
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import crc32c
import h5py
import numpy as np
import torch

from hpcbench.common.data.loader import reader_threads
from hpcbench.common.data.prefetch import prefetch_map
from hpcbench.common.step import prepare_batch
from hpcbench.common.workload import DataShard, Workload
from hpcbench.workloads.cosmoflow.workload import CosmoFlowWorkload
from hpcbench.workloads.deepcam.workload import DeepCAMWorkload
from benchmarks.deepcam_step import build, time_steps
from benchmarks.budget import Budget, add_budget_argument, say
from benchmarks.machine import describe, header

DATASETS = {  # name -> (workload, datagen arguments)
    "cf-plain": ("cosmoflow", ["--samples", "{cf}", "--val-samples", "1", "--size", "128", "--plain", "--quiet"]),
    "cf-gzip": ("cosmoflow", ["--samples", "{cf}", "--val-samples", "1", "--size", "128", "--quiet"]),
    "dc": ("deepcam", ["--samples", "{dc}", "--eval-samples", "1", "--height", "768", "--width", "1152"]),
}


def make_datasets(work: Path, cf: int, dc: int, names: list[str], budget: Budget) -> list[str]:
    """The datasets of ``names`` that are ready (made when missing, within the budget)."""
    ready = []
    for name in names:
        workload, args = DATASETS[name]
        out = work / name
        if not (out / ".done").exists():
            shutil.rmtree(out, ignore_errors=True)  # a datagen cut off (no .done) left part of it
            if budget.spent():
                budget.skip(f"dataset {name} (not generated)")
                continue
            args = [a.format(cf=cf, dc=dc) for a in args]
            say(f"+ hpcbench datagen {workload} --out {out} {' '.join(args)}")
            try:
                subprocess.run([sys.executable, "-m", "hpcbench", "datagen", workload, "--out", str(out), "--workers",
                                "2", *args], check=True, stdout=subprocess.DEVNULL, timeout=budget.timeout(3600))
            except subprocess.TimeoutExpired:
                budget.skip(f"dataset {name} (its datagen ran out of the budget)")
                continue
            (out / ".done").write_text("")
        ready.append(name)
    return ready


# --- the limits: the same files, the plainest read, per thread ------------------------------
def limit_buffer(nbytes: int) -> np.ndarray:
    """A limit's reused read buffer, allocated as the loader's batch buffers are (``np.empty``): numpy
    advises huge pages for large arrays, so with transparent hugepages on ``madvise`` a ``bytearray``
    (4 KiB pages) would read about a quarter slower than the loader's buffers on the same box."""
    return np.empty(nbytes, np.uint8)


def read_crc(files: list[Path]) -> int:
    """(a): each file into one reused buffer, then its CRC-32C."""
    buf = limit_buffer(max(f.stat().st_size for f in files))
    n = 0
    for f in files:
        with open(f, "rb", buffering=0) as fh:
            got = fh.readinto(buf)
        crc32c.crc32c(memoryview(buf)[:got])
        n += got
    return n


def read_inflate(files: list[Path], out_size: int) -> int:
    """(b): each gzip file read, then inflated by zlib into its final size (zlib checks the CRC-32)."""
    n = 0
    for f in files:
        n += len(zlib.decompress(f.read_bytes(), 31, out_size))
    return n


DC_KEYS = ("climate/data", "climate/labels_0")


def read_h5_direct(files: list[Path]) -> int:
    """(c): HDF5 ``read_direct`` of a DeepCAM sample's two datasets into two reused arrays (float32
    data, uint8 labels: the loader's batch dtypes), as the loader reads them, less its checks."""
    n, bufs = 0, None
    for f in files:
        with h5py.File(f, "r") as h:
            d, lab = (h[k] for k in DC_KEYS)
            if bufs is None or bufs[0].shape != d.shape:
                bufs = np.empty(d.shape, np.float32), np.empty(lab.shape, np.uint8)
            d.read_direct(bufs[0])
            lab.read_direct(bufs[1])
        n += bufs[0].nbytes + bufs[1].nbytes
    return n


def raw_extents(files: list[Path]) -> dict[Path, list[tuple[int, int]]] | None:
    """Each file's (offset, bytes) of the datasets ``DC_KEYS`` as stored; None when one of them is not
    stored contiguously (chunked or compressed: no single extent to read raw)."""
    out = {}
    for f in files:
        with h5py.File(f, "r") as h:
            ext = [(h[k].id.get_offset(), h[k].id.get_storage_size()) for k in DC_KEYS]
        if any(off is None for off, _ in ext):
            return None
        out[f] = [(int(off), int(size)) for off, size in ext]
    return out


def read_extents(path: Path, extents: list[tuple[int, int]], buf: np.ndarray | bytearray) -> int:
    """The bytes of ``extents`` of ``path``, one after the other into ``buf`` (``os.preadv``); their count."""
    fd = os.open(path, os.O_RDONLY)
    try:
        at = 0
        for off, size in extents:
            got = os.preadv(fd, [memoryview(buf)[at:at + size]], off)
            if got != size:
                raise SystemExit(f"{path}: read {got} of the {size} bytes at offset {off}")
            at += size
    finally:
        os.close(fd)
    return at


def read_raw(files: list[Path], extents: dict[Path, list[tuple[int, int]]]) -> int:
    """(d): the datasets' stored bytes read by ``os.preadv`` into one reused buffer, no HDF5."""
    buf = limit_buffer(max(sum(size for _, size in extents[f]) for f in files))
    return sum(read_extents(f, extents[f], buf) for f in files)


def parallel_rate(fn: Callable[[list[Path]], int], files: list[Path], threads: int) -> float:
    """Bytes/s of ``fn`` over ``files``, split over ``threads`` threads (0: this one)."""
    t = time.perf_counter()
    if threads <= 1:
        n = fn(files)
    else:
        with ThreadPoolExecutor(threads) as pool:
            n = sum(pool.map(fn, [files[i::threads] for i in range(threads)]))
    return n / (time.perf_counter() - t)


# --- the loaders ------------------------------------------------------------------------------
def loader(wl: Workload, threads: int, batch: int, device: torch.device) -> Any:
    wl.cfg.data.threads = threads  # type: ignore[attr-defined]
    return wl.train_loader(DataShard(rank=0, size=1, seed=1, local_batch_size=batch, device=device))


def storage_batches(ld: Any) -> Iterator[Any]:
    """The loader's host batches before the transform: ``Loader.__iter__`` on a GPU, less the copy."""
    return prefetch_map(lambda idx: ld.spec.read_batch(ld.source, idx, pin=ld.cuda), ld.sampler.batches(),
                        ld.threads, ld.prefetch)


def loader_rate(batches: Iterable[Any], sample_bytes: int) -> tuple[float, float]:
    """(samples/s, decoded bytes/s) of one pass."""
    t, n = time.perf_counter(), 0
    for b in batches:
        n += len(b[0])
    dt = time.perf_counter() - t
    return n / dt, n * sample_bytes / dt


def step_rate(wl: Workload, ld: Any, batch: int, device: torch.device, steps: int) -> float:
    """Samples/s of the harness's training step (bf16, channels-last) on one batch from the loader."""
    step = build(wl, "bf16", True, "eager", device)
    x = prepare_batch(next(iter(ld)), device, channels_last=True)
    time_steps(step, x, 2, device)
    return batch / time_steps(step, x, steps, device)


# --- one workload -------------------------------------------------------------------------------
Limit = tuple[str, Callable[[list[Path]], int], str]  # (key, files -> bytes read, what it is)


class Case:
    """One dataset: its loader against its limits; the first limit is the judged one."""

    def __init__(self, title: str, wl: Workload, files: list[Path], sample_bytes: int, limits: list[Limit],
                 goal: str, note: str = "") -> None:
        self.title, self.wl, self.files, self.sample_bytes = title, wl, files, sample_bytes
        self.limits, self.goal, self.note = limits, goal, note
        self.best: dict[str, tuple[float, float]] = {}
        self.paired: dict[int, list[float]] = {}  # threads -> loader / judged limit, measured in the same round
        self.round_s = float("inf")  # the fastest round so far: what one more round costs

    def record(self, key: str, rate: tuple[float, float]) -> None:
        say(f"  {self.title} {key}: {rate[0]:8.2f} samples/s {rate[1] / 1e9:6.3f} GB/s")
        if rate[1] > self.best.get(key, (0.0, 0.0))[1]:
            self.best[key] = rate


def run_round(case: Case, thread_counts: list[int], batch: int, device: torch.device, dali: bool) -> None:
    for n in thread_counts:
        judged = 0.0
        for key, fn, _ in case.limits:
            lim = parallel_rate(fn, case.files, n)
            judged = judged or lim
            case.record(f"{key}/{n}", (lim / case.sample_bytes, lim))
        ld = loader(case.wl, n, batch, device)
        got = loader_rate(storage_batches(ld), case.sample_bytes)
        case.record(f"loader/{n}", got)
        case.paired.setdefault(n, []).append(got[1] / judged)
        if device.type == "cpu":
            case.record(f"loader+transform/{n}", loader_rate(ld, case.sample_bytes))
        if dali:
            case.wl.cfg.train.loader = "dali"  # type: ignore[attr-defined]
            case.record(f"dali/{n}", loader_rate(loader(case.wl, n, batch, device), case.sample_bytes))
            case.wl.cfg.train.loader = "torch"  # type: ignore[attr-defined]


def report(case: Case, thread_counts: list[int], step: float | None) -> list[str]:
    out = [f"{case.title}: {len(case.files)} files, {case.sample_bytes / 2**20:.1f} MiB decoded per sample; "
           f"limits {'; '.join(name for _, _, name in case.limits)}; goal {case.goal}"]
    if case.note:
        out.append(f"  {case.note}")
    if step is not None:
        out.append(f"  training step (bf16, channels-last, harness): {step:9.1f} samples/s")
    for n in thread_counts:
        cores = max(1, n)
        label = "threads=0" if n == 0 else f"threads={n}"
        out.append(f"  {label}:")
        for key, _, name in case.limits:
            lim = case.best[f"{key}/{n}"][1]
            out.append(f"    limit {name:38s} {lim / 1e9:6.3f} GB/s total, {lim / cores / 1e9:6.3f} GB/s per core")
        for key, what in (("loader", "loader (storage dtype)"), ("loader+transform", "loader +cpu transform"),
                          ("dali", "DALI cpu (+transform)")):
            if f"{key}/{n}" not in case.best:
                continue
            sps, bps = case.best[f"{key}/{n}"]
            ratio = ("; " + ", ".join(f"{100 * bps / case.best[f'{k}/{n}'][1]:5.1f}% of {k}" for k, _, _ in case.limits)
                     if key == "loader" else "")
            out.append(f"    {what:24s} {sps:8.2f} samples/s {bps / 1e9:6.3f} GB/s total, {sps / cores:7.2f} "
                       f"samples/s {bps / cores / 1e9:6.3f} GB/s per core{ratio}")
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--work", default="/tmp/loader_limit", help="dataset folder (made there when missing)")
    p.add_argument("--cosmoflow-samples", type=int, default=48)
    p.add_argument("--deepcam-samples", type=int, default=12)
    p.add_argument("--threads", type=int, default=0, help="N reader threads (0: data.threads=-1's choice on a GPU, "
                   "min(4, cores))")
    p.add_argument("--batch", type=int, default=0, help="local batch (0: 8 CosmoFlow, 4 DeepCAM)")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds (at most)")
    p.add_argument("--steps", type=int, default=10, help="timed training steps on a GPU (0: none)")
    p.add_argument("--only", choices=["cf-plain", "cf-gzip", "dc"], action="append", default=[])
    add_budget_argument(p, 900.0)
    a = p.parse_args()
    budget = Budget(a.budget_s)
    say(header(describe()))
    work = Path(a.work)
    ready = make_datasets(work, a.cosmoflow_samples, a.deepcam_samples, a.only or list(DATASETS), budget)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    n_threads = a.threads or reader_threads(-1, None)
    thread_counts = [0, n_threads]
    try:
        import nvidia.dali  # noqa: F401

        dali = True
    except ImportError:
        dali = False

    cases: dict[str, Case] = {}
    for name in [n for n in ("cf-plain", "cf-gzip") if n in ready]:
        wl = CosmoFlowWorkload(CosmoFlowWorkload.load_config(
            "full", [f"data.root={work / name}", "train.loader=torch"]))
        files = sorted((work / name / "train").iterdir())
        xb = 128 ** 3 * 4 * 2
        if name == "cf-plain":
            cases[name] = Case("CosmoFlow plain TFRecords", wl, files, xb,
                               [("(a)", read_crc, "(a) page-cache read + crc32c")], "loader >= 80% of (a) per core")
        else:
            size = xb + 200  # the inflated stream: record framing + Example around x
            cases[name] = Case("CosmoFlow gzip TFRecords", wl, files, xb,
                               [("(b)", lambda f, s=size: read_inflate(f, s), "(b) read + zlib inflate")],
                               "loader >= 80% of (b)")
    if "dc" in ready:
        wl = DeepCAMWorkload(DeepCAMWorkload.load_config("full", [f"data.root={work / 'dc'}", "train.loader=torch"]))
        files = sorted((work / "dc" / "train").glob("data-*.h5"))
        direct: Limit = ("(c)", read_h5_direct, "(c) h5py read_direct, reused arrays")
        extents = raw_extents(files)
        if extents is None:
            cases["dc"] = Case("DeepCAM HDF5", wl, files, 768 * 1152 * (16 * 4 + 1), [direct], "loader >= 80% of (c)",
                               "no raw limit (d): a dataset is not stored contiguously (chunked or compressed)")
        else:
            raw: Limit = ("(d)", lambda f, e=extents: read_raw(f, e), "(d) raw preadv of the dataset bytes")
            cases["dc"] = Case("DeepCAM HDF5", wl, files, 768 * 1152 * (16 * 4 + 1), [raw, direct],
                               "loader >= 80% of (d)")

    for case in cases.values():  # warm the page cache: the rates below are CPU costs
        for f in case.files:
            f.read_bytes()
    done: dict[str, int] = {}
    for r in range(a.rounds):
        for name, case in cases.items():
            if r and budget.left() < case.round_s:
                budget.skip(f"{name} round {r + 1} of {a.rounds} (one round needs ~{case.round_s:.0f} s)")
                continue
            batch = a.batch or (8 if name.startswith("cf") else 4)
            say(f"round {r + 1}/{a.rounds}: {case.title}")
            t = time.perf_counter()
            run_round(case, thread_counts, batch, device, dali)
            case.round_s = min(case.round_s, time.perf_counter() - t)
            done[name] = done.get(name, 0) + 1

    say(f"loader_limit: device {device}, reader threads 0 and {n_threads}, best of the interleaved rounds done "
          f"({', '.join(f'{k} {v}' for k, v in done.items()) or 'none'} of {a.rounds}), "
          f"page cache warm; torch threads {torch.get_num_threads()}; DALI {'installed' if dali else 'not installed'}; "
          f"load at the end {' / '.join(f'{x:.2f}' for x in os.getloadavg())} (1/5/15 min)")
    print("loader rate = read + validate (CRCs, shapes, dtypes) + batch, in the storage dtype (what a GPU receives)")
    for name, case in cases.items():
        batch = a.batch or (8 if name.startswith("cf") else 4)
        step = None
        if device.type == "cuda" and a.steps and name != "cf-gzip":
            step = step_rate(case.wl, loader(case.wl, n_threads, batch, device), batch, device, a.steps)
        print(f"batch {batch}: " + "\n".join(report(case, thread_counts, step)))
    print("goals (loader / limit): judged on the median over the rounds of the ratio measured within one round (the "
          "loader right after its limit: a shared box's load drifts between rounds, and the best of each over "
          "different rounds can pair a quiet limit with a loaded loader); the best-of ratio beside it")
    for name, case in cases.items():
        key, _, limit_name = case.limits[0]
        for n in thread_counts:
            ratios = case.paired[n]
            med = float(np.median(ratios))
            best = case.best[f"loader/{n}"][1] / case.best[f"{key}/{n}"][1]
            verdict = "met" if med >= 0.8 else f"MISSED by {100 * (0.8 - med):.1f} points"
            print(f"  {case.title:26s} threads={n}: {100 * med:5.1f}% of {limit_name} (rounds "
                  f"{', '.join(f'{100 * r:.0f}%' for r in ratios)}; best-of {100 * best:.1f}%) (goal >= 80%): {verdict}")
    budget.done()


if __name__ == "__main__":
    main()
