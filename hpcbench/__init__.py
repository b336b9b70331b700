"""hpcbench: an MLPerf-HPC-style benchmark suite for AI training on HPC systems.

The only top-level import name of the project: the shared machinery is ``hpcbench.common``, staging is
``hpcbench.staging``, the workloads are ``hpcbench.workloads.*`` (see :mod:`hpcbench._folders`).
"""
from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys
from pathlib import Path

from . import _folders

__version__ = "0.1.0"

_HERE = Path(__file__).resolve().parent
_ROOT = _HERE.parent


class _CheckoutFinder(importlib.abc.MetaPathFinder):
    """Imports ``hpcbench.common`` etc. from the repository's top-level folders when running from a source
    checkout (an installed wheel has them inside ``hpcbench/`` and never installs this finder)."""

    def find_spec(self, fullname: str, path: object = None, target: object = None) -> importlib.machinery.ModuleSpec | None:
        folder = _folders.folder_of(fullname, _ROOT)
        if folder is None:
            return None
        return importlib.util.spec_from_file_location(fullname, folder / "__init__.py",
                                                      submodule_search_locations=[str(folder)])


def _from_checkout() -> bool:
    return (not (_HERE / "common").is_dir() and (_ROOT / "pyproject.toml").is_file()
            and (_ROOT / "common" / "__init__.py").is_file())


# first in line: the mapped names follow the ``hpcbench`` package actually imported (a second checkout on
# PYTHONPATH, say), never an editable install's record of another tree
if _from_checkout() and not any(isinstance(f, _CheckoutFinder) for f in sys.meta_path):
    sys.meta_path.insert(0, _CheckoutFinder())
