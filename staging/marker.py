"""What a node-local staging folder holds, and whether it can be trusted.

* ``.hpcbench/lock``: one stager per folder at a time (``flock``, released by the kernel when the
  stager exits or dies, so a killed run leaves no stale lock).
* ``.hpcbench/owner.json``: the dataset the folder belongs to (its manifest's sha256). A folder
  holds one dataset: restaging another removes the old one's journaled files (``--clean``) or is
  refused; files staging did not write are never removed.
* ``.hpcbench/staged_manifest.json``: the completion marker. Removed first by every stager, written
  atomically last, after every file was verified; it records the dataset, its manifest hash, the
  layout (which shard-set of which node) and every file with size and crc32c.
* ``.hpcbench/staged.jsonl``: the journal (:class:`hpcbench.staging.nodelocal.Journal`).

Training calls :func:`require_staged` where it opens the data root: a node-local root
(``data.node_local``), and any root that carries staging's state (:func:`stage_state`) whatever
option led there, must be completely staged; a folder made by hand trains as it is.
"""
from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from hpcbench.common.atomic import atomic_write_text
from hpcbench.common.errors import DataError
from hpcbench.common.nodepath import node_path

from .manifest import STATE_DIR, safe_relpath
from .nodelocal import JOURNAL, Journal

MARKER = "staged_manifest.json"
OWNER = "owner.json"
LOCK = "lock"
MARKER_FORMAT = "hpcbench-staged"
MARKER_VERSION = 2


@dataclass(frozen=True)
class NodeLayout:
    """Which part of the dataset a node holds: shard-set ``slot`` of ``nodes_per_instance``."""

    node: int
    slot: int
    nodes_per_instance: int
    instances: int
    nodes: int


def state(dest: Path, name: str) -> Path:
    return dest / STATE_DIR / name


def stage_state(root: Path) -> list[str]:
    """What ``hpcbench stage`` left in ``root`` (its state folder and the files in it, relative
    names); empty for a folder staging never touched (made by hand, a shared dataset)."""
    d = root / STATE_DIR
    if not (d.is_dir() or d.is_symlink()):
        return []
    return [f"{STATE_DIR}/{n}" for n in (MARKER, JOURNAL, OWNER, LOCK) if (d / n).exists()] or [f"{STATE_DIR}/"]


class DestLock:
    """An exclusive, non-blocking lock on ``dest`` for the life of one stager."""

    def __init__(self, dest: Path) -> None:
        self.path = state(dest, LOCK)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(self.fd, 200, 0).decode(errors="replace").strip() or "unknown process"
            os.close(self.fd)
            raise DataError(f"{dest} is being staged by another `hpcbench stage` ({holder}); wait for it to "
                            f"finish, or stage to another folder") from None
        os.ftruncate(self.fd, 0)
        os.pwrite(self.fd, f"pid {os.getpid()} on {socket.gethostname()}\n".encode(), 0)

    def release(self) -> None:
        if self.fd >= 0:
            with contextlib.suppress(OSError):
                os.ftruncate(self.fd, 0)
            os.close(self.fd)  # closing the descriptor releases the flock
            self.fd = -1


def remove_marker(dest: Path) -> None:
    state(dest, MARKER).unlink(missing_ok=True)


def claim(dest: Path, dataset: str, sha: str, journal: Journal, clean: bool) -> int:
    """Make ``dest`` belong to dataset ``sha``; returns the number of old files removed. A folder
    staged with another dataset is emptied of that dataset's journaled files with ``clean``, else
    refused; a non-empty folder staging never wrote to is refused (its files would be trained on)."""
    owner_path = state(dest, OWNER)
    try:
        owner = json.loads(owner_path.read_text())
        if not isinstance(owner, dict):
            owner = {}
    except FileNotFoundError:
        owner = None
    except (OSError, ValueError):
        owner = {}
    removed = 0
    if owner is None and not journal.done:
        foreign = sorted(p.name for p in dest.iterdir() if p.name != STATE_DIR)
        if foreign:
            raise DataError(f"{dest} is not empty and was not made by `hpcbench stage` (it holds "
                            f"{', '.join(foreign[:3])}{', ...' if len(foreign) > 3 else ''}); training would "
                            "read those files too: stage into an empty folder")
    elif (owner or {}).get("manifest_sha256") != sha:
        old = (owner or {}).get("dataset", "an unknown dataset")
        if not clean:
            raise DataError(f"{dest} holds another dataset ({old}, manifest "
                            f"{str((owner or {}).get('manifest_sha256', '?'))[:12]}); pass --clean to remove its "
                            f"{len(journal.files())} staged files first, or stage to another folder")
        removed = remove_files(dest, [f[0] for f in journal.files()])
        journal.rewrite(set())
    atomic_write_text(owner_path, json.dumps({"dataset": dataset, "manifest_sha256": sha}) + "\n")
    return removed


def refuse_links(dest: Path, state_only: bool = False) -> None:
    """Refuse a dest with a symbolic link to a folder anywhere inside it (``.hpcbench`` included):
    removing or writing a file below it would act on the link's target, outside dest. Checked before
    anything in dest is removed or written; :func:`inside` checks every path again."""
    if state_only:
        p = dest / STATE_DIR
        if p.is_symlink():
            raise DataError(f"{p} is a symbolic link (to {os.readlink(p)}); staging keeps its state there and "
                            "never writes through a link: remove the link (or stage to another folder)")
        return
    for top, dirs, _ in os.walk(dest):
        for d in dirs:
            p = Path(top) / d
            if p.is_symlink():
                raise DataError(f"{p} is a symbolic link (to {os.readlink(p)}) inside the staging folder {dest}; "
                                "staging never removes or writes files through a link: remove the link "
                                "(or stage to another folder)")


def inside(dest: Path, name: str) -> Path:
    """``dest/name`` for a member or journaled name, refusing one whose folders (below dest) include
    a symbolic link: the path would lead outside dest."""
    rel = safe_relpath(name, str(dest))
    p = dest
    for part in rel.parts[:-1]:
        p = p / part
        if p.is_symlink():
            raise DataError(f"{p} is a symbolic link inside the staging folder {dest}; refusing to remove or "
                            f"write {name} through it")
    return dest / rel


def remove_files(dest: Path, names: list[str]) -> int:
    """Remove staged files (journaled names, checked again: never a path outside ``dest``, never
    through a linked folder). Every name is checked before the first removal."""
    paths = [inside(dest, name) for name in names]
    n = 0
    for p in paths:
        if p.is_file() or p.is_symlink():
            p.unlink()
            n += 1
    return n


def split_folders(names: list[str], splits: list[str]) -> set[str]:
    """The folders a staged layout owns: the top folder of every listed file and every split name
    (``""``: dest itself, when files are listed at the top)."""
    tops = {n.split("/", 1)[0] if "/" in n else "" for n in names}
    return tops | {sp for sp in splits if sp and not sp.startswith("_")}


def unlisted(dest: Path, names: list[str], splits: list[str]) -> list[str]:
    """Files in the layout's split folders that the list does not name (hidden files aside, which
    no loader reads): a loader lists those folders, so it would read them too."""
    listed = set(names)
    out: list[str] = []
    for top in sorted(split_folders(names, splits)):
        d = dest / top if top else dest
        if d.is_symlink() or not d.is_dir():
            continue
        found = (d.rglob("*") if top else d.iterdir())
        for p in found:
            rel = p.relative_to(dest)
            if STATE_DIR in rel.parts or any(x.startswith(".") for x in rel.parts) or p.is_dir():
                continue
            if rel.as_posix() not in listed:
                out.append(rel.as_posix())
    return sorted(out)


def write_marker(dest: Path, dataset: str, sha: str, layout: NodeLayout, splits: list[str],
                 files: list[list]) -> Path:
    out = state(dest, MARKER)
    atomic_write_text(out, json.dumps({
        "format": MARKER_FORMAT, "version": MARKER_VERSION, "complete": True, "dataset": dataset,
        "manifest_sha256": sha, "layout": asdict(layout), "splits": splits, "files": len(files),
        "bytes": sum(f[1] for f in files),
        "entries": [{"name": n, "size": s, "crc32c": c} for n, s, c in files]}, indent=0) + "\n")
    return out


def check_staged(root: Path, dataset: str | None = None, slot: int | None = None,
                 nodes_per_instance: int | None = None, whole: bool = False) -> dict[str, Any]:
    """Refuse a staged folder that is not completely staged: no marker (never staged, being staged, or
    a failed run), another dataset, another layout (this node would train on another node's share; with
    ``whole``, the root is read as the whole dataset), a listed file missing or of the wrong size, or a
    file in the split folders the marker does not list. Every message names the folder, what is missing
    or extra, and the fixes. Returns the marker."""
    hint = ("stage it again with `hpcbench stage` (or pass --set data.require_staged=false to train on the "
            "folder as it is)")
    path = state(root, MARKER)
    try:
        m = json.loads(path.read_text())
    except FileNotFoundError:
        found = [n for n in stage_state(root) if not n.endswith(MARKER)]
        has = f"; it holds {', '.join(found)}" if found else ""
        raise DataError(f"{root}: not a completely staged folder (no {STATE_DIR}/{MARKER}: never staged, still "
                        f"being staged, the last staging failed, or the marker was removed{has}); {hint}") from None
    except (OSError, ValueError) as exc:
        raise DataError(f"{path}: unreadable completion marker ({exc}); {hint}") from None
    if not isinstance(m, dict) or m.get("format") != MARKER_FORMAT or m.get("version") != MARKER_VERSION \
            or m.get("complete") is not True:
        raise DataError(f"{path}: not a completion marker of this version; {hint}")
    if dataset is not None and m.get("dataset") != dataset:
        raise DataError(f"{root}: staged with dataset {m.get('dataset')!r}, not {dataset!r}; {hint}")
    lay = m.get("layout") or {}
    if whole and lay.get("nodes_per_instance", 1) != 1:
        raise DataError(f"{root}: holds only shard-set {lay.get('slot')} of {lay.get('nodes_per_instance')} (staged "
                        "for node-local training), but the data root is read as the whole dataset: pass --set "
                        "data.node_local=true (each node trains on its part), or stage the whole dataset to "
                        f"every node (--instances = nodes); or {hint}")
    if nodes_per_instance is not None and nodes_per_instance > 1 and (
            lay.get("nodes_per_instance") != nodes_per_instance or lay.get("slot") != slot):
        raise DataError(f"{root}: staged for shard-set {lay.get('slot')} of {lay.get('nodes_per_instance')} nodes "
                        f"per instance, but this rank trains as node {slot} of {nodes_per_instance}; {hint}")
    if nodes_per_instance == 1 and lay.get("nodes_per_instance") != 1:
        raise DataError(f"{root}: holds only part of the dataset (shard-set {lay.get('slot')} of "
                        f"{lay.get('nodes_per_instance')}), but this instance runs on one node; {hint}")
    entries = m.get("entries", [])
    missing, changed = [], []
    for e in entries:
        p = root / safe_relpath(e["name"], str(path))
        if not p.is_file():
            missing.append(e["name"])
        elif p.stat().st_size != e["size"]:
            changed.append(e["name"])
    if missing or changed:
        what = "; ".join(f"{len(x)} {kind} ({_few(x)})" for kind, x in (("missing", missing),
                                                                      ("of another size", changed)) if x)
        raise DataError(f"{root}: staged files are missing or changed since staging: {what}; {hint}")
    extra = unlisted(root, [e["name"] for e in entries], list(m.get("splits") or []))
    if extra:
        raise DataError(f"{root}: {len(extra)} files in the staged folders are not in the completion marker "
                        f"({_few(extra)}); the loader would read them too: remove them or {hint}")
    return m


def _few(names: list[str]) -> str:
    return ", ".join(names[:3]) + (", ..." if len(names) > 3 else "")


def require_staged(data: Any, layout: Any, dataset: str | None) -> None:
    """The training entry's check, where ``hpcbench train`` opens the data root (``{node}`` already
    replaced), unless ``data.require_staged`` is false. A node-local root (``data.node_local``) must be
    completely staged for this dataset and this rank's place in the layout; any other root that carries
    staging's state (:func:`stage_state`: ``--data`` naming a staged folder) must be completely staged
    with the whole dataset. A folder without staging's state (made by hand, a shared dataset) is used
    as it is. ``layout`` is the rank's :class:`hpcbench.common.dist.Layout`."""
    if not getattr(data, "require_staged", True):
        return
    root = Path(node_path(str(data.root), layout.node_index, "data.root"))
    if getattr(data, "node_local", False):
        check_staged(root, dataset, layout.instance_node_index, layout.nodes_per_instance)
    elif stage_state(root):
        check_staged(root, dataset, whole=True)
