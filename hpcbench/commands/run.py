"""`hpcbench run`: the embedded default, end to end on one machine.

tiny synthetic data (``datagen``) -> ``pack`` into zstd shards -> stage to emulated node-local
folders and train the ``mini`` preset as K concurrent instances in one ``mpiexec`` job
(``train --stage-from/--stage-to``, so staging is in the MLPerf logs) -> ``report``.
Each step runs as a child process so it is exactly what a user would type; a failed step stops the
run and names the step and its exit status.
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from hpcbench.common.errors import HpcbenchError
from hpcbench import registry

from ._common import add_device_arg

DONE = ".hpcbench-complete"  # marker written after a step's output is complete


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--workload", default="cosmoflow", help=f"one of: {', '.join(registry.names())} (default cosmoflow)")
    parser.add_argument("--workdir", default="runs/default", type=Path,
                        help="where data, packed shards, node-local copies, results and plots go")
    parser.add_argument("--instances", type=int, default=2, help="concurrent training instances (default 2)")
    parser.add_argument("--ranks-per-instance", type=int, default=1, help="ranks per instance (default 1)")
    parser.add_argument("--config", default="mini", help="preset or TOML file (default mini)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="config override passed to train (repeatable)")
    add_device_arg(parser)
    parser.add_argument("--seed", type=int, default=0, help="datagen seed (default 0)")
    parser.add_argument("--fresh", action="store_true", help="delete the work dir first (else reuse data and shards)")
    parser.add_argument("--mpiexec", default=None, help="mpiexec to use (default: the one next to this Python, else PATH)")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds allowed for the training job")


def find_mpiexec(explicit: str | None) -> str:
    if explicit:
        return explicit
    local = Path(sys.executable).parent / "mpiexec"
    if local.exists():
        return str(local)
    found = shutil.which("mpiexec") or shutil.which("mpirun")
    if not found:
        raise HpcbenchError("no mpiexec found: install the 'mpich' extra (python3 dev.py setup) or pass --mpiexec")
    return found


#: `hpcbench train` exit status when an instance ended without reaching its target (or failed)
NOT_CONVERGED = 4


def _step(name: str, cmd: list[str], timeout: float | None = None, allowed: tuple[int, ...] = (0,)) -> int:
    print(f"\n==> {name}: {' '.join(cmd)}", flush=True)
    t0 = time.perf_counter()
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    try:
        proc = subprocess.run(cmd, env=env, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise HpcbenchError(f"step '{name}' did not finish within {timeout:.0f} s") from None
    if proc.returncode not in allowed:
        raise HpcbenchError(f"step '{name}' failed with exit status {proc.returncode} (command: {' '.join(cmd)})")
    print(f"<== {name}: {time.perf_counter() - t0:.1f} s", flush=True)
    return proc.returncode


def run(args: argparse.Namespace) -> int:
    from hpcbench.common.dist import check_local_job

    cls = registry.datagen(args.workload)
    # a layout the GPUs cannot hold is refused here, before any data is generated
    device = check_local_job(args.device, args.instances, args.ranks_per_instance)
    print(f"==> device: {device} ({args.instances} instance(s) x {args.ranks_per_instance} rank(s), --device {args.device})")
    name = registry.entry(args.workload).name
    work: Path = args.workdir.resolve()
    if args.fresh and work.exists():
        shutil.rmtree(work)
    raw, packed, local, results = work / "raw", work / "packed", work / "local", work / "results"
    hb = [sys.executable, "-m", "hpcbench"]
    ranks = args.instances * args.ranks_per_instance
    times: dict[str, float] = {}
    t_all = time.perf_counter()

    def timed(key: str, *step_args, **step_kwargs) -> int:  # noqa: ANN002, ANN003
        t0 = time.perf_counter()
        status = _step(*step_args, **step_kwargs)
        times[key] = time.perf_counter() - t0
        return status

    if not (raw / DONE).exists():
        if raw.exists():
            shutil.rmtree(raw)  # an interrupted datagen: start over
        timed("datagen", "datagen", [*hb, "datagen", name, "--out", str(raw), "--seed", str(args.seed),
                                     *cls.embedded_datagen_args()])
        (raw / DONE).write_text("ok\n")
    else:
        print(f"==> datagen: reusing {raw}")
    timed("pack", "pack", [*hb, "pack", "--dataset", name, "--source", str(raw), "--dest", str(packed)])
    train_cmd = [find_mpiexec(args.mpiexec), "-n", str(ranks), *hb, "train", name, "--config", args.config,
                 "--instances", str(args.instances), "--ranks-per-node", str(args.ranks_per_instance),
                 "--stage-from", str(packed), "--stage-to", str(local / "node{node}"),
                 "--results", str(results), "--overwrite", "--progress", "lines", "--device", device]
    for override in args.overrides:
        train_cmd += ["--set", override]
    # an instance that misses its target is still reported: run the report, then say so
    trained = timed("stage+train", "stage + train", train_cmd, timeout=args.timeout, allowed=(0, NOT_CONVERGED))
    timed("report", "report", [*hb, "report", str(results)])
    total = time.perf_counter() - t_all
    print("\nhpcbench run finished in {:.1f} s ({})".format(
        total, ", ".join(f"{k} {v:.1f} s" for k, v in times.items())))
    print(f"  MLPerf logs : {results / 'results'}")
    print(f"  report      : {results / 'report'} (report.json, report.csv, *.png)")
    if trained == NOT_CONVERGED:
        print("hpcbench run: not every instance reached its quality target (see the report)", file=sys.stderr)
        return NOT_CONVERGED
    return 0
