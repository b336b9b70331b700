"""Lays the wheel out under the one import name ``hpcbench`` (the metadata is in pyproject.toml).

The repository's top-level folders map to ``hpcbench.common``, ``hpcbench.staging`` and
``hpcbench.workloads.<folder>`` as ``hpcbench/_folders.py`` says; every sub-package below them is found.
The Slurm job templates and system files (``jobs/templates/*.in``, ``jobs/systems/*.toml``, kept at the
repository's top) go into the wheel as ``hpcbench/jobs/...``, where ``hpcbench/jobs.py`` reads them when
installed.
"""
import runpy
from pathlib import Path

from setuptools import find_packages, setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
mapped = runpy.run_path(str(ROOT / "hpcbench" / "_folders.py"))["mapped"](ROOT)

packages = ["hpcbench", *(f"hpcbench.{p}" for p in find_packages("hpcbench"))]
for name, folder in mapped.items():
    packages += [name, *(f"{name}.{p}" for p in find_packages(folder))]

#: files below jobs/ that the wheel carries as hpcbench/jobs/<same path>
JOBS_DATA = ("templates/*.in", "systems/*.toml")


class BuildPy(build_py):
    """build_py that also copies ``jobs/`` data (JOBS_DATA) to ``hpcbench/jobs/`` in the build folder.
    An editable install reads them from the checkout's ``jobs/``, so it copies nothing."""

    def _jobs_data(self) -> list[tuple[Path, Path]]:
        found = sorted(f for pattern in JOBS_DATA for f in (ROOT / "jobs").glob(pattern))
        return [(f, Path(self.build_lib, "hpcbench", f.relative_to(ROOT))) for f in found]

    def run(self) -> None:
        super().run()
        if self.editable_mode:
            return
        for src, dest in self._jobs_data():
            self.mkpath(str(dest.parent))
            self.copy_file(str(src), str(dest))

    def get_outputs(self, include_bytecode: bool = True) -> list[str]:
        out = super().get_outputs(include_bytecode)
        return out if self.editable_mode else out + [str(d) for _, d in self._jobs_data()]


setup(packages=packages, package_dir={"hpcbench": "hpcbench", **mapped}, cmdclass={"build_py": BuildPy})
