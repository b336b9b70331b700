"""Lays the wheel out under the one import name ``hpcbench`` (the metadata is in pyproject.toml).

The repository's top-level folders map to ``hpcbench.common``, ``hpcbench.staging`` and
``hpcbench.workloads.<folder>`` as ``hpcbench/_folders.py`` says; every sub-package below them is found.
"""
import runpy
from pathlib import Path

from setuptools import find_packages, setup

ROOT = Path(__file__).resolve().parent
mapped = runpy.run_path(str(ROOT / "hpcbench" / "_folders.py"))["mapped"](ROOT)

packages = ["hpcbench", *(f"hpcbench.{p}" for p in find_packages("hpcbench"))]
for name, folder in mapped.items():
    packages += [name, *(f"{name}.{p}" for p in find_packages(folder))]

setup(packages=packages, package_dir={"hpcbench": "hpcbench", **mapped})
