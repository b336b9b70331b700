"""`hpcbench stage`: distribute packed shards to node-local storage (sharded reads + MPI Allgatherv)."""
from __future__ import annotations

import argparse
import math
from pathlib import Path

from hpcbench import registry
from hpcbench.commands._common import MAX_THREADS, add_layout_args, check_range, mib_bytes

MAX_CHUNK_MB = 2047  # MiB per member per Allgatherv round: below MPI's int count limit (2**31 - 1 bytes)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dataset", choices=sorted(registry.dataset_names()), default=None,
                        help="dataset (checked against the manifest; picks the file layout for --method copy "
                             "(default: every file) and --dry-run)")
    parser.add_argument("--source", type=Path, help="packed folder (manifest.json), or the raw folder for --method "
                                                    "copy (default: the site's [data] DATASET)")
    parser.add_argument("--dest", help="node-local folder; '{node}' is replaced by the node index "
                                       "(needed when nodes are emulated on one host, e.g. /tmp/st/node{node}; "
                                       "default: the site's [paths] stage_dir + /DATASET)")
    parser.add_argument("--system", metavar="NAME|FILE",
                        help="site settings jobs/systems/<NAME>.toml (or a .toml path) that give --source, --dest and, "
                             "where nodes are emulated, --ranks-per-node for --dataset (default: $HPCBENCH_SYSTEM)")
    parser.add_argument("--splits", default=None, help="comma-separated splits to stage (default: all)")
    parser.add_argument("--replicate", default="", help="comma-separated splits every node gets in full")
    parser.add_argument("--method", choices=["packed", "independent", "copy"], default="packed",
                        help="packed: sharded reads + Allgatherv (default); independent: compression without sharded "
                             "reads, each node reads its whole packed shard-set itself; copy: baseline and the v1.0 "
                             "way, each node copies raw files")
    parser.add_argument("--verify", action="store_true", help="re-check staged files' crc32c (before and after); "
                        "with --method copy, against the source files as they are now (changed ones restaged)")
    parser.add_argument("--clean", action="store_true",
                        help="the dest holds another dataset: remove that dataset's staged files (never other files)")
    parser.add_argument("--chunk-mb", type=int, default=64, help="bytes per member per Allgatherv round (MiB)")
    parser.add_argument("--threads", type=int, default=2, help="decompress/write threads per node")
    parser.add_argument("--timeout", type=float, default=300.0,
                        help="seconds without progress from peers before the job is aborted (default 300)")
    parser.add_argument("--reserve-mb", type=float, default=0.0, help="free space to keep on node-local disk")
    parser.add_argument("--shard-mb", type=float, default=256, help="--method copy: group raw files like pack")
    parser.add_argument("--report", type=Path, default=None, help="write the JSON report here (rank 0)")
    g = parser.add_argument_group("dry run (no data, no MPI)")
    g.add_argument("--dry-run", action="store_true", help="print the plan for --nodes/--instances and exit")
    g.add_argument("--nodes", type=int, default=None, help="dry run: cluster nodes")
    g.add_argument("--fs-GBps", type=float, default=None,
                   help="model: shared filesystem read bandwidth, all readers together (the cluster's; without "
                        "the four rates the model is not run, unless --rates-from-probe)")
    g.add_argument("--fabric-GBps", type=float, default=None, help="model: fabric bandwidth into a node")
    g.add_argument("--write-GBps", type=float, default=None,
                   help="model: node-local write rate per node (--rates-from-probe: copy's write path on this "
                        "machine x --threads, up to its cores)")
    g.add_argument("--decompress-GBps", type=float, default=None,
                   help="model: decompression rate per node, output bytes (default: what the probed packed write "
                        "path costs beyond copy's, x --threads up to the cores)")
    g.add_argument("--client-GBps", type=float, default=None, help="model: per-node read limit from the shared FS")
    g.add_argument("--rates-from-probe", action="store_true",
                   help="model: take the rates not given from a probe of THIS machine (a stand-in that predicts this "
                        "box, not a cluster; said so in the output)")
    g.add_argument("--probe", action="store_true", help="model: measure this machine again (implies --rates-from-probe)")
    g.add_argument("--plot", type=Path, default=None, help="model: write the scaling curve (PNG) here")
    add_layout_args(parser)


def _csv(s: str | None) -> list[str]:
    return [x for x in (s or "").split(",") if x]


def _check_args(args: argparse.Namespace) -> None:
    """Named errors for bad numbers, before MPI starts (the same on every rank: rank 0 prints it)."""
    from hpcbench.common.errors import ConfigError

    if args.instances < 1:
        raise ConfigError(f"--instances must be >= 1, got {args.instances}")
    if args.ranks_per_node is not None and args.ranks_per_node < 1:
        raise ConfigError(f"--ranks-per-node must be >= 1, got {args.ranks_per_node} (leave it out for "
                          "'ranks that share memory form a node')")
    if args.nodes is not None and args.nodes < 1:
        raise ConfigError(f"--nodes must be >= 1, got {args.nodes}")
    for key, v in (("--chunk-mb", args.chunk_mb), ("--threads", args.threads), ("--timeout", args.timeout),
                   ("--shard-mb", args.shard_mb)):
        if not (v > 0 and math.isfinite(v)):  # --timeout inf would turn the watchdog off
            raise ConfigError(f"{key} must be a finite number > 0, got {v:g}")
    from hpcbench.staging.exchange import check_timeout

    check_timeout(args.timeout)  # the watchdog's range (a timer cannot take 1e10 s)
    if not (args.reserve_mb >= 0 and math.isfinite(args.reserve_mb)):
        raise ConfigError(f"--reserve-mb must be a finite number >= 0, got {args.reserve_mb:g}")
    # upper bounds and the byte counts the MiB options become (the checks above name the lower bounds)
    check_range("--chunk-mb", args.chunk_mb, 1, MAX_CHUNK_MB, "one Allgatherv round must stay below MPI's 2**31 "
                "bytes")
    check_range("--threads", args.threads, 1, MAX_THREADS)
    mib_bytes("--shard-mb", args.shard_mb)
    for name in ("fs_GBps", "fabric_GBps", "write_GBps", "decompress_GBps", "client_GBps"):
        v = getattr(args, name)
        if v is not None and not (v > 0 and math.isfinite(v)):
            raise ConfigError(f"--{name.replace('_GBps', '-GBps').replace('_', '-')} must be a finite number > 0, "
                              f"got {v:g}")
    if args.report is not None and not args.dry_run:
        if args.report.is_dir():
            raise ConfigError(f"--report {args.report}: is a folder; give the path of the JSON file to write")
        if not args.report.parent.is_dir():
            raise ConfigError(f"--report {args.report}: its folder {args.report.parent} does not exist")


def run(args: argparse.Namespace) -> int:
    _check_args(args)
    if args.dry_run:
        return _dry_run(args)
    _site_paths(args)
    import faulthandler

    from hpcbench.common.dist import init_distributed
    from hpcbench.staging.exchange import deadline, end_job, start_guard, tell_guard
    from hpcbench.staging.guard import STOP_GRACE_S
    from hpcbench.staging.report import format_report
    from hpcbench.staging.stage import StageOptions, stage

    # before MPI starts: a watcher process ends this rank if it is stopped inside MPI_Init, where its
    # peers wait without a bound (and after the job's last barrier; hpcbench.staging.guard)
    start_guard(args.timeout)
    layout = registry.layout(args.dataset) if args.dataset else None
    # a peer stopped before its watcher started leaves this rank in MPI_Init, where no Python runs
    # (the deadline's thread cannot): faulthandler's C thread ends it (exit 1, its stack printed) after
    # the watchers' own bound, and the launcher ends the job
    faulthandler.dump_traceback_later(args.timeout + 2 * STOP_GRACE_S, exit=True)
    try:
        with deadline(args.timeout, "setting up MPI (init_distributed)"):
            env = init_distributed(args.instances, args.ranks_per_node, torch_backend=None)
    finally:
        faulthandler.cancel_dump_traceback_later()
    tell_guard("up")  # every peer is through MPI_Init: from here on they watch this rank
    # hpcbench.cli calls this with the exit status: a roll call under the watchdog (naming a rank that
    # does not come), then MPI_Finalize with the watcher armed (a peer stopped after the report would
    # otherwise keep the job alive forever)
    args.on_exit = lambda rc: end_job(rc, args.timeout)
    opts = StageOptions(args.source, args.dest, layout, _csv(args.splits) or None, _csv(args.replicate),
                        args.method, args.verify, args.chunk_mb, args.threads, args.timeout,
                        int(args.reserve_mb * 2**20), int(args.shard_mb * 2**20), args.report, clean=args.clean)
    rep = stage(env, opts)
    if rep is not None:
        print(format_report(rep))
    return 0


def _site_paths(args: argparse.Namespace) -> None:
    """--source/--dest (and --ranks-per-node, where the site emulates nodes) from the site settings when
    not given (hpcbench.site)."""
    from hpcbench.common.errors import ConfigError
    from hpcbench.site import Options, resolve

    command = "stage" + (f" --dataset {args.dataset}" if args.dataset else "")
    if args.method == "copy" and args.source is None:
        raise ConfigError(f"{command} --method copy reads the raw dataset: pass --source RAW (a site's [data] "
                          "entry is the packed folder)")
    found = resolve(args.dataset, None if args.source is None else str(args.source), args.dest, args.system,
                    Options(command, "--source", "--dest", "--system",
                            "pass them, or --dataset NAME to take them from the site settings (--system or HPCBENCH_SYSTEM)"))
    args.source, args.dest = Path(found.source), found.dest
    if args.ranks_per_node is None:
        args.ranks_per_node = found.ranks_per_node


def _dry_run(args: argparse.Namespace) -> int:
    from hpcbench.common.errors import ConfigError
    from hpcbench.staging.manifest import MANIFEST, Manifest
    from hpcbench.staging.report import dry_run, known_shards

    nodes = args.nodes
    if not nodes or nodes < 1:
        raise ConfigError("--dry-run needs --nodes N (the cluster's node count)")
    if args.source is not None:
        man = Manifest.load(args.source / MANIFEST)
        splits = {n: (s.replicate, s.shards) for n, s in man.splits.items()}
    else:
        if args.dataset is None:
            raise ConfigError("--dry-run without --source needs --dataset (to use its known full size)")
        layout = registry.layout(args.dataset)
        if not layout.known:
            raise ConfigError(f"dataset {args.dataset!r} has no known size; pass --source PACKED_DIR")
        splits = {sp: (False, known_shards(layout, sp, int(args.shard_mb * 2**20))) for sp in layout.known}
    sel = _csv(args.splits)
    if sel:
        splits = {k: v for k, v in splits.items() if k in sel}
    try:
        print(dry_run(splits, nodes, args.instances, _csv(args.replicate)))
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    raw = sum(s.raw_bytes for _, shards in splits.values() for s in shards)
    packed = sum(s.bytes for _, shards in splits.values() for s in shards)
    print(_model(args, nodes, raw, packed))
    return 0


def _model(args: argparse.Namespace, nodes: int, raw: int, packed: int) -> str:
    """The staging model's prediction (staging.model) with rates given or probed on this machine."""
    from hpcbench.staging.model import Layout, System, format_table, predict_all, weak_scaling
    from hpcbench.staging.probe import node_rates, probe

    given = {"fs_GBps": args.fs_GBps, "fabric_GBps": args.fabric_GBps, "write_GBps": args.write_GBps,
             "decompress_GBps": args.decompress_GBps}  # range-checked in _check_args
    missing = [k for k, v in given.items() if v is None]
    if missing and not (args.rates_from_probe or args.probe):
        flags = ", ".join("--" + k.replace("_GBps", "-GBps").replace("_", "-") for k in missing)
        return (f"model (staging.model): not run: predicting {nodes} nodes needs the cluster's rates, and {flags} "
                "not given. Pass them (docs/staging.md: what each one means, and the published points' values), "
                "or --rates-from-probe to use this machine's probe as a stand-in (it predicts this box, not a cluster).")
    pr = probe(refresh=args.probe) if missing or args.probe else {}
    # a probed node stands in for a cluster node with this machine's cores (its own, not shared)
    probed = {"fs_GBps": pr.get("fs_GBps")} | (node_rates(pr, args.threads, pr["cores_effective"]) if pr else {})
    rates = {k: v if v is not None else probed[k] for k, v in given.items()}
    sys_ = System(**rates, client_GBps=args.client_GBps or math.inf, chunk_bytes=args.chunk_mb * 2**20)
    src = ", ".join(f"{k} {v:.3g} ({'given' if given[k] is not None else 'probe'})" for k, v in rates.items())
    lines = ([f"WARNING: {', '.join(missing)} measured on THIS machine ({pr.get('cpu')} x{pr.get('cores')}), not on "
              f"the {nodes}-node cluster: the prediction below is a stand-in (--rates-from-probe)"] if missing else []) + [
             f"model (staging.model): {src}; client limit "
             f"{'none' if args.client_GBps is None else format(args.client_GBps, 'g') + ' GB/s'}"
             + (f"; probe {'cached' if pr.get('cached') else 'measured'} on {pr.get('cpu')} x{pr.get('cores')}"
                if pr else ""),
             f"predicted staging for {nodes} nodes, {args.instances} instances "
             f"({raw / 1e9:,.1f} GB raw, {packed / 1e9:,.1f} GB packed per instance):",
             format_table(predict_all(raw, packed, Layout(nodes, args.instances), sys_))]
    if args.instances <= nodes:
        n = nodes // args.instances
        ks = [1 << i for i in range(args.instances.bit_length()) if 1 << i < args.instances] + [args.instances]
        curve = weak_scaling(raw, packed, n, ks, sys_)
        lines.append(f"scaling curve ({n} nodes per instance), total s: {'K':>5} " + " ".join(f"{m:>12}" for m in curve))
        for i, k in enumerate(ks):
            lines.append(f"{'':>43}{k:>5} " + " ".join(f"{curve[m][i]:>12.1f}" for m in curve))
        if args.plot:
            _plot(args.plot, ks, curve, n, nodes, raw)
            lines.append(f"plot: {args.plot}")
    return "\n".join(lines)


def _plot(path: Path, ks: list[int], curve: dict[str, list[float]], n: int, nodes: int, raw: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4))
    for m, ys in curve.items():
        ax.plot(ks, ys, marker="o", label=m)
    ax.set_xscale("log", base=2)
    ax.set_xlabel(f"instances ({n} nodes each)")
    ax.set_ylabel("predicted staging time (s)")
    ax.set_title(f"staging model: {raw / 1e12:,.2f} TB raw per instance", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
