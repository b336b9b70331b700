"""Where the packages of the ``hpcbench`` namespace live in the repository (the one home of that mapping).

The repository keeps the design card's folders at its top (``common/``, ``staging/``, one folder per
workload or group of workloads), but everything installs and imports under one name:

* ``common/``  -> ``hpcbench.common``
* ``staging/`` -> ``hpcbench.staging``
* any other top-level folder with an ``__init__.py`` (``cosmoflow/``, ``deepcam/``, ``opencatalyst/``,
  ``mlperf_training/``, a new workload's folder) -> ``hpcbench.workloads.<folder>``

``setup.py`` reads this file (it imports nothing) to lay the wheel out, and ``hpcbench/__init__.py``
uses it to import the same names from a source checkout (a GPU node that runs with ``PYTHONPATH=$PWD``,
an editable install), so every way of running imports the same modules.
"""
from __future__ import annotations

from pathlib import Path

#: top-level folders that map to ``hpcbench.<folder>``
SHARED = ("common", "staging")
#: top-level folders that are not part of the installed package
NOT_INSTALLED = ("hpcbench", "tests", "benchmarks", "docs", "jobs", "build", "dist")
WORKLOADS = "hpcbench.workloads"


def folder_of(fullname: str, root: Path) -> Path | None:
    """The repository folder of package ``fullname`` if it is one of the mapped top-level packages."""
    head, _, last = fullname.rpartition(".")
    if head == "hpcbench" and last in SHARED:
        folder = root / last
    elif head == WORKLOADS and last not in SHARED and last not in NOT_INSTALLED:
        folder = root / last
    else:
        return None
    return folder if (folder / "__init__.py").is_file() else None


def mapped(root: Path) -> dict[str, str]:
    """Every mapped package name -> its folder (relative to ``root``), as ``setup.py`` lays the wheel out."""
    out: dict[str, str] = {}
    for d in sorted(p for p in root.iterdir() if p.is_dir() and (p / "__init__.py").is_file()):
        if d.name in NOT_INSTALLED or d.name.startswith("."):
            continue
        name = f"hpcbench.{d.name}" if d.name in SHARED else f"{WORKLOADS}.{d.name}"
        out[name] = d.name
    return out
