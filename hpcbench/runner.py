"""Multi-instance runner behind ``hpcbench train --instances K``.

K = 1 is a strong-scaling run; K > 1 runs K concurrent, independent instances (weak scaling), each
with its own communicator and torch process group (``hpcbench.common.dist``), its own seed (the harness uses
``train.seed + instance``) and its own MLPerf log, in the layout of :mod:`hpcbench.results_layout`.

Failure isolation. An exception on any rank of an instance (a crash, a divergence the harness
raises, a data error) is caught on that rank; the rank then tears down its torch process group, which
makes its peers' pending gloo/NCCL collectives fail promptly instead of hanging, so they land in the
same path. The instance leader closes its log with ``run_stop status=aborted`` (unless the harness
already wrote run_stop). Other instances are untouched and run to the end. Every rank then reports its
outcome to world rank 0 (point-to-point, no collective), which waits for all healthy instances; ranks of
a failed instance that never report (stuck in an MPI collective of their instance) are given
``straggler_grace_s`` seconds, after which rank 0 writes their instance's aborted run_stop, prints the
summary and ends the job with ``MPI_Abort`` so nothing hangs. No rank exits non-zero before the
summary is written (the mpiexec of the MPICH wheel kills the whole job when one rank does).
"""
from __future__ import annotations

import dataclasses
import json
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hpcbench.common.atomic import atomic_write_text
from hpcbench.common.dist import DistEnv, idle_barrier, mpi
from hpcbench.common.errors import ConfigError, HpcbenchError
from hpcbench.common.mllog import MLPerfLogger, result_filename
from hpcbench.common.nodepath import node_path
from hpcbench.common.system import SystemDescription, node_accelerators
from hpcbench.common.workload import Workload

from . import results_layout as rl

OUTCOME_TAG = 7301
ABORT_DRAIN_S = 1.0  # seconds between printing the summary and MPI_Abort
TrainFn = Callable[[Workload, DistEnv, MLPerfLogger, SystemDescription], Any]


@dataclass
class RunnerOptions:
    results: Path  # the submission root (results/ and systems/ go below it)
    system: SystemDescription
    stage_from: Path | None = None  # packed dataset on shared storage
    stage_to: str | None = None  # node-local destination; may contain {node}
    dataset: str | None = None  # registered dataset the workload reads: the packed manifest must be of it
    overwrite: bool = False  # weak scaling: replace an earlier job's result files
    straggler_grace_s: float = 120.0
    progress: str | bool | None = None  # common.progress mode (None: auto)
    mode: str | None = None  # strong | weak; default: strong for one instance, weak for several
    instance_offset: int | None = None  # one srun per instance: this job's instance k writes result_<offset+k>
    system_nodes: int | None = None  # nodes of the whole system for systems/<name>.json (default: this job's)
    suite: str = "hpc"  # the workload's suite (common.suites): which results layout
    division: str | None = None  # the run's train.division: the logs' and systems/<name>.json's (None: the file's)


def _log_has(path: Path, key: str) -> bool:
    needle = f'"key": "{key}"'
    try:
        return any(needle in line for line in path.read_text(errors="replace").splitlines())
    except OSError:
        return False


def close_aborted(path: Path, error: str) -> None:
    """Append ``run_stop status=aborted`` to an instance's log unless it already has a run_stop."""
    if _log_has(path, "run_stop"):
        return
    log = MLPerfLogger(path)
    log.end("run_stop", metadata={"status": "aborted", "error": error[:300]})
    log.close()


def system_for_run(env: DistEnv, opts: RunnerOptions) -> SystemDescription:
    """``systems/<name>.json`` for this run: the run's division (what its logs say), the layout's nodes
    (``--system-nodes`` when given; emulated nodes count as the layout has them) and the accelerators each
    node uses (0 only on a CPU run)."""
    lay = env.layout
    device = getattr(env.device, "type", "cpu") if env.device is not None else "cpu"
    gpus = 0
    if device == "cuda":
        import torch

        gpus = torch.cuda.device_count()
    accel = node_accelerators(opts.system.accelerators_per_node, device, gpus, lay.local_size)
    return dataclasses.replace(opts.system, division=opts.division or opts.system.division,
                               number_of_nodes=opts.system_nodes or lay.num_nodes, accelerators_per_node=accel)


def _prepare(env: DistEnv, opts: RunnerOptions, benchmark: str) -> tuple[Path, int, str]:
    """World rank 0 checks the results folder and writes the system file; (folder, first log index, mode)."""
    lay = env.layout
    if opts.suite == "training":
        if opts.mode:
            raise ConfigError("--mode is for hpc-suite workloads; a training-suite result folder has no mode "
                              "(each instance is one run of results/<system>/<benchmark>/)")
        mode = ""
    else:
        mode = opts.mode or rl.mode_for(lay.num_instances)
        if mode not in rl.MODES:
            raise ConfigError(f"--mode must be one of {', '.join(rl.MODES)}, got {mode!r}")
    folder = rl.benchmark_dir(opts.results, opts.system.system_name, mode, benchmark)
    err, index = None, 0
    if lay.is_world_leader:
        try:
            folder.mkdir(parents=True, exist_ok=True)
            if not mode:  # training: every instance is one more run (the rules ask for 10)
                index = opts.instance_offset if opts.instance_offset is not None else \
                    rl.next_free_block(folder, lay.num_instances)
                taken = [folder / result_filename(index + k) for k in range(lay.num_instances)
                         if (folder / result_filename(index + k)).exists()]
                if taken and not opts.overwrite:
                    raise ConfigError(f"{taken[0]} already exists; use another --instance-offset or --overwrite")
                for p in taken:
                    p.unlink()
            elif mode == "weak":
                index = opts.instance_offset or 0
                mine = [folder / result_filename(index + k) for k in range(lay.num_instances)]
                # a job that owns the folder (one launch for all instances) must not mix with older logs
                old = rl.existing_results(folder) if opts.instance_offset is None else [p for p in mine if p.exists()]
                if old and not opts.overwrite:
                    raise ConfigError(f"{folder} already holds {len(old)} result files of an earlier weak-scaling "
                                      "job; use a new --results folder or --overwrite to replace them")
                for p in old:
                    p.unlink()
            else:
                index = rl.next_free_index(folder)
            system = system_for_run(env, opts)
            mixed = rl.other_division_logs(opts.results, system.system_name, system.division)
            if mixed:
                shown = ", ".join(str(p) for p in mixed[:5]) + (f" and {len(mixed) - 5} more" if len(mixed) > 5 else "")
                raise ConfigError(f"this run is in the {system.division} division but {shown} of system "
                                  f"{system.system_name!r} say(s) another division; "
                                  f"{rl.system_file(opts.results, system.system_name)} states one division for "
                                  "all of a system's results: use another --results folder (or --system-name)")
            system.write(rl.system_file(opts.results, opts.system.system_name))
        except (ConfigError, OSError) as exc:
            err = str(exc)
    err, index = env.comm.bcast((err, index), root=0)
    if err:
        raise ConfigError(err)
    return folder, index, mode


def set_aside_unstarted(log_path: Path, folder: Path) -> Path | None:
    """A log without ``run_start`` records an instance that failed before its timed run began (bad config or
    data, a missing file): it is not a run, yet the official summarizer would count a ``result_N.txt`` as a
    non-converged one and the package checker would count it towards the required runs. Move it beside the
    job summary, outside the folder the official tools read; returns its new path (None: the log is a run)."""
    if not log_path.exists() or _log_has(log_path, "run_start"):
        return None
    dest = rl.summary_file(folder).parent / "failed_before_run_start" / log_path.name
    dest.parent.mkdir(parents=True, exist_ok=True)
    log_path.replace(dest)
    return dest


def stage_in_job(env: DistEnv, source: Path, dest: str, mllogger: MLPerfLogger, dataset: str | None = None) -> str:
    """Stage a packed dataset to node-local storage inside the job (logged as staging_start/stop);
    returns this node's data root, which holds this node's part only (``make_workload`` sets
    ``data.node_local``). ``dataset`` (a name from ``registry.dataset_names()``, None: any)
    must be the packed manifest's dataset."""
    try:
        from hpcbench.staging.stage import StageOptions, stage
    except ImportError:
        raise ConfigError("--stage-from needs the staging layer (staging/stage.py), which is not in this "
                          "installation; stage first with `hpcbench stage` and pass --data") from None
    from . import registry

    root = node_path(dest, env.layout.node_index, "--stage-to")  # a bad placeholder: refused before staging
    layout = registry.layout(dataset) if dataset else None
    stage(env, StageOptions(source=Path(source), dest=dest, layout=layout), mllog=mllogger)
    return root


def run_instances(env: DistEnv, benchmark: str, make_workload: Callable[[str | None], Workload],
                  opts: RunnerOptions, train_fn: TrainFn | None = None) -> list[dict[str, Any]] | None:
    """Every rank: train this rank's instance, isolate failures, report. Returns the per-instance
    summary on world rank 0 (None elsewhere)."""
    lay = env.layout
    folder, first, mode = _prepare(env, opts, benchmark)
    index = first + lay.instance
    log_path = folder / result_filename(index)
    mllogger = MLPerfLogger(log_path if lay.is_instance_leader else None)
    data_root = None
    if opts.stage_from is not None:
        if not opts.stage_to:
            raise ConfigError("--stage-from needs --stage-to (node-local destination, may contain {node})")
        data_root = stage_in_job(env, opts.stage_from, opts.stage_to, mllogger, opts.dataset)
    outcome: dict[str, Any] = {"rank": lay.world_rank, "instance": lay.instance, "log": str(log_path),
                               "status": None, "error": None, "result": None}
    try:
        workload = make_workload(data_root)
        if train_fn is None:
            from hpcbench.common.trainer import run_training

            result = run_training(workload, env, mllogger, opts.system, progress=opts.progress)
        else:
            result = train_fn(workload, env, mllogger, opts.system)
        outcome["status"] = getattr(result, "status", "success")
        outcome["result"] = result.to_dict() if hasattr(result, "to_dict") else None
    except Exception as exc:  # noqa: BLE001 - any failure of this instance is reported, never propagated
        outcome["status"], outcome["error"] = "failed", f"{type(exc).__name__}: {exc}"
        if _timed_out(exc):
            outcome["error"] = (f"a collective waited longer than the torch group's timeout ({env.torch_timeout_s:g} s, "
                                f"hpcbench train --timeout) for a peer rank of instance {lay.instance}: one is stopped, "
                                f"hung or dead ({str(exc).splitlines()[0][-120:]})")
        print(f"[rank {lay.world_rank}, instance {lay.instance}] failed: {outcome['error']}", file=sys.stderr)
        if not isinstance(exc, HpcbenchError) and not _peer_gone(exc) and not _timed_out(exc):  # those say it all
            traceback.print_exc(file=sys.stderr)
        env.close()  # drop the torch group: peers blocked in a collective get an error, not a hang
    if lay.is_instance_leader and outcome["status"] != "success":
        mllogger.close()
        close_aborted(log_path, outcome["error"] or "did not reach the quality target")
        # a weak-scaling job keeps every instance's log in place: a failed instance is part of its result
        moved = set_aside_unstarted(log_path, folder) if outcome["status"] == "failed" and mode != "weak" else None
        if moved is not None:
            outcome["log"] = str(moved)
            print(f"[instance {lay.instance}] failed before run_start: its log is not a run and was moved out of "
                  f"the results folder to {moved}", file=sys.stderr, flush=True)
    mllogger.close()
    env.close()
    return _report(env, outcome, opts, folder)


PEER_GONE = ("Connection closed by peer", "Connection reset by peer", "NCCL communicator was aborted")


TIMED_OUT = ("Timed out waiting", "Watchdog caught collective operation timeout")  # gloo's and NCCL's words


def _timed_out(exc: BaseException) -> bool:
    """A collective of the torch group that gave up after its timeout: a peer is stopped, hung or dead."""
    return isinstance(exc, RuntimeError) and any(k in str(exc) for k in TIMED_OUT)


def _peer_gone(exc: BaseException) -> bool:
    """A collective that failed because a peer of this instance failed first and dropped its process
    group: the peer reports the cause; a traceback here would only hide it."""
    return isinstance(exc, RuntimeError) and any(k in str(exc) for k in PEER_GONE)


def _report(env: DistEnv, outcome: dict[str, Any], opts: RunnerOptions, folder: Path) -> list[dict[str, Any]] | None:
    comm, lay = env.comm, env.layout
    if not lay.is_world_leader:
        comm.send(outcome, dest=0, tag=OUTCOME_TAG)
        idle_barrier(comm)  # released when rank 0 has written the summary (or ended a stuck job): sleeping, not spinning
        return None
    outcomes, missing = _collect(comm, lay.world_size, lay.instance_size, outcome, opts.straggler_grace_s)
    summary = summarize(outcomes, lay.num_instances, lay.instance_size, missing)
    summary_path = rl.summary_file(folder)
    summary_path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(summary_path, json.dumps(summary, indent=2, default=str) + "\n")
    for s in summary:
        print(format_line(s), flush=True)
    if missing:
        for s in summary:
            if s["leader_missing"]:
                close_aborted(Path(s["log"]), "instance leader never finished (stuck after a peer failed)")
        print(f"runner: ranks {sorted(missing)} never finished; ending the job (results above are complete)",
              file=sys.stderr, flush=True)
        sys.stdout.flush()
        time.sleep(ABORT_DRAIN_S)  # MPI_Abort kills the launcher too: let it forward the summary first
        comm.Abort(5)
    idle_barrier(comm)
    return summary


def _collect(comm: Any, world: int, instance_size: int, own: dict[str, Any],
             grace_s: float) -> tuple[dict[int, dict[str, Any]], set[int]]:
    """Receive every rank's outcome; give up on ranks of failed instances after ``grace_s``."""
    MPI = mpi()
    outcomes = {0: own}
    failed_since: dict[int, float] = {}
    if own["status"] == "failed":
        failed_since[own["instance"]] = time.monotonic()
    while len(outcomes) < world:
        status = MPI.Status()
        if comm.iprobe(source=MPI.ANY_SOURCE, tag=OUTCOME_TAG, status=status):
            o = comm.recv(source=status.Get_source(), tag=OUTCOME_TAG)
            outcomes[o["rank"]] = o
            if o["status"] == "failed":
                failed_since.setdefault(o["instance"], time.monotonic())
            continue
        missing = set(range(world)) - set(outcomes)
        now = time.monotonic()
        if all(r // instance_size in failed_since and now - failed_since[r // instance_size] > grace_s
               for r in missing):
            return outcomes, missing
        time.sleep(0.05)
    return outcomes, set()


def summarize(outcomes: dict[int, dict[str, Any]], instances: int, size: int, missing: set[int]) -> list[dict[str, Any]]:
    rows = []
    for k in range(instances):
        ranks = [outcomes.get(r) for r in range(k * size, (k + 1) * size)]
        known = [o for o in ranks if o is not None]
        leader = ranks[0]
        errors = [f"rank {o['rank']}: {o['error']}" for o in known if o["error"]]
        status = "failed" if errors or any(o is None for o in ranks) else (leader or {}).get("status", "failed")
        rows.append({"instance": k, "status": status, "errors": errors,
                     "log": (leader or known[0])["log"] if (leader or known) else None,
                     "result": leader["result"] if leader else None, "leader_missing": leader is None,
                     "missing_ranks": [r for r in range(k * size, (k + 1) * size) if r in missing]})
    return rows


def format_line(s: dict[str, Any]) -> str:
    r = s["result"] or {}
    if s["status"] == "failed":
        why = "; ".join(s["errors"]) or f"ranks {s['missing_ranks']} never finished"
        return f"instance {s['instance']}: FAILED ({why}) -> {s['log']}"
    metric = r.get("final_metric")
    return (f"instance {s['instance']}: {s['status']} after {r.get('epochs', '?')} epochs, "
            f"{r.get('metric_key', 'metric')}={'n/a' if metric is None else format(metric, '.4f')}, "
            f"time to solution {r.get('time_to_solution_s', 0.0):.2f} s, "
            f"{r.get('samples_per_s', 0.0):.1f} samples/s -> {s['log']}")
