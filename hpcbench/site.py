"""Site facts for staging: where a dataset's packed copy lives on shared storage and where it goes on a
node, so that ``mpirun hpcbench stage --dataset cosmoflow`` and ``hpcbench train cosmoflow --stage`` need
no paths on a cluster.

A site is a system settings file (read here for ``hpcbench.jobs`` too), ``jobs/systems/<name>.toml`` (the file ``hpcbench jobs render --system``
renders jobs from), chosen by ``hpcbench stage --system NAME|FILE``, ``hpcbench train --site NAME|FILE``
or the environment variable ``HPCBENCH_SYSTEM`` (which every rendered job exports). Staging reads::

    [data]
    cosmoflow = "/lustre/datasets/cosmoflow-packed"   # DATASET's packed folder (`hpcbench pack --dest`)
    [paths]
    stage_dir = "/local_nvme/hpcbench/stage"          # node-local root: DATASET stages to <stage_dir>/DATASET
    [node]
    emulate_nodes = true                              # nodes emulated on one host: stage_dir must hold {node},
    tasks_per_node = 1                                # and --ranks-per-node defaults to tasks_per_node

Explicit ``--source``/``--dest`` (``train --stage-from/--stage-to`` with a value) win over the site's entries.
The site is read when an entry is missing or the site option is given (then its ``--ranks-per-node``
default applies too); with both paths given, ``$HPCBENCH_SYSTEM`` is not read.
"""
from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hpcbench.common.errors import ConfigError
from hpcbench.common.nodepath import has_node

#: the environment variable that names the site (a name in jobs/systems/ or a .toml path)
ENV = "HPCBENCH_SYSTEM"
SOURCE_HINT = '"/shared/{d}-packed"'
DEST_HINT = '"/node-local/hpcbench/stage"'


def _jobs_dir() -> Path:
    """``hpcbench/jobs/`` where the wheel put its copy (an installed package), else ``jobs/`` at the top of the
    source checkout this module runs from (``setup.py`` copies the one to the other)."""
    here = Path(__file__).resolve().parent
    installed = here / "jobs"
    return installed if (installed / "templates").is_dir() else here.parent / "jobs"


#: the job templates and system settings (``templates/``, ``systems/``)
JOBS_DIR = _jobs_dir()


def system_path(name: str, jobs_dir: Path = JOBS_DIR) -> Path:
    """``jobs/systems/<name>.toml``, or ``name`` itself when it is a ``.toml`` path."""
    return Path(name) if name.endswith(".toml") else jobs_dir / "systems" / f"{name}.toml"


def read_system(name: str, jobs_dir: Path = JOBS_DIR) -> tuple[Path, dict[str, Any]]:
    """The system settings file ``name`` (see :func:`system_path`) and its TOML, unchecked; a missing
    file or bad TOML is a :class:`ConfigError` naming the file."""
    path = system_path(name, jobs_dir)
    if not path.is_file():
        known = sorted(p.stem for p in (jobs_dir / "systems").glob("*.toml"))
        raise ConfigError(f"system settings {path} not found; known systems: {', '.join(known) or 'none'}")
    try:
        return path, tomllib.loads(path.read_text())
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"system settings {path}: unreadable: {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"system settings {path}: invalid TOML: {exc}") from None


@dataclass
class Options:
    """How one command names the three inputs (for its error messages)."""
    command: str  # "stage --dataset cosmoflow"
    source: str  # "--source"
    dest: str  # "--dest"
    site: str  # "--system"
    no_dataset: str  # why there is no dataset to look up, and what to do


@dataclass
class StagePaths:
    source: str
    dest: str
    ranks_per_node: int | None  # the site's, when it emulates nodes (None: not from a site, or real nodes)
    site: Path | None  # the site file the entries came from (None: all given explicitly)


def dest_rule(stage_dir: str, dataset: str) -> str:
    """A dataset's node-local folder under the site's ``[paths] stage_dir`` (one folder per dataset:
    a staged folder belongs to one dataset)."""
    return f"{stage_dir.rstrip('/')}/{dataset}"


def packed_source(sysd: dict[str, Any], dataset: str) -> str:
    """The site's ``[data] DATASET`` ('' when absent or empty)."""
    value = sysd.get("data", {}).get(dataset, "")
    return value if isinstance(value, str) else ""


def site_ranks_per_node(sysd: dict[str, Any], where: str) -> int | None:
    """``[node] tasks_per_node`` where the site emulates nodes on one host (``emulate_nodes = true``)."""
    node = sysd.get("node", {})
    if node.get("emulate_nodes") is not True:
        return None
    tpn = node.get("tasks_per_node")
    if not isinstance(tpn, int) or isinstance(tpn, bool) or tpn < 1:
        raise ConfigError(f"{where}: [node] tasks_per_node must be an integer >= 1 where emulate_nodes = true "
                          f"(the ranks of one emulated node), got {tpn!r}")
    return tpn


def resolve(dataset: str | None, source: str | None, dest: str | None, site: str | None, opts: Options) -> StagePaths:
    """``source`` and ``dest`` where given, else the site's entries for ``dataset``. The site is ``site``
    (an option's value) or ``$HPCBENCH_SYSTEM``; a missing site, file or key is a :class:`ConfigError`
    that names the file and the exact keys to add."""
    if source and dest and not site:  # nothing to look up ($HPCBENCH_SYSTEM is not read)
        return StagePaths(source, dest, None, None)
    origin = opts.site if site else ENV
    name = site or os.environ.get(ENV) or None
    if dataset is None:
        raise ConfigError(f"{opts.command} needs {opts.source} and {opts.dest}: {opts.no_dataset}")
    keys = _keys(dataset, need_source=not source, need_dest=not dest)
    if name is None:
        raise ConfigError(f"{opts.command}: {_missing(opts, source, dest)} not given and no site settings to take "
                          f"{'them' if not source and not dest else 'it'} from: pass {opts.site} NAME|FILE or set "
                          f"{ENV}=NAME|FILE (jobs/systems/<name>.toml, or a .toml path) holding {keys}")
    try:
        path, sysd = read_system(name)
    except ConfigError as exc:
        raise ConfigError(f"{opts.command}: {origin} {name}: {exc}") from None
    where = f"site settings {path} (from {origin})"
    missing = []
    src = source or packed_source(sysd, dataset)
    if not src:
        missing.append(_keys(dataset, need_source=True, need_dest=False) + f" (or pass {opts.source})")
    stage_dir = sysd.get("paths", {}).get("stage_dir")
    if not dest and not (isinstance(stage_dir, str) and stage_dir):
        missing.append(_keys(dataset, need_source=False, need_dest=True) + f" (or pass {opts.dest})")
    if missing:
        raise ConfigError(f"{opts.command}: {where} has no staging entry for {dataset}: add " + "; add ".join(missing))
    rpn = site_ranks_per_node(sysd, where)
    if not dest and rpn is not None and not has_node(stage_dir):
        raise ConfigError(f"{opts.command}: {where}: [paths] stage_dir = {stage_dir!r} must hold a {{node}} "
                          "placeholder where [node] emulate_nodes = true (each emulated node needs its own folder), "
                          "e.g. \"/tmp/hpcbench-stage/node{node}\"")
    return StagePaths(src, dest or dest_rule(stage_dir, dataset), rpn, path)


def _keys(dataset: str, need_source: bool, need_dest: bool) -> str:
    parts = []
    if need_source:
        parts.append(f"[data] {dataset} = {SOURCE_HINT.format(d=dataset)} (the folder `hpcbench pack --dataset "
                     f"{dataset} --dest` wrote)")
    if need_dest:
        parts.append(f"[paths] stage_dir = {DEST_HINT} (node-local root; {dataset} stages to "
                     f"<stage_dir>/{dataset}; with {{node}} in it where nodes are emulated)")
    return " and ".join(parts)


def _missing(opts: Options, source: str | None, dest: str | None) -> str:
    names = [o for o, v in ((opts.source, source), (opts.dest, dest)) if not v]
    return " and ".join(names)
