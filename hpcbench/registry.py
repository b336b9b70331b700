"""The one place that knows the list of workloads. Entries are imported only when asked for, so
importing the CLI never imports torch-geometric, DALI or a workload's model code."""
from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from hpcbench.common.errors import ConfigError, HpcbenchError

if TYPE_CHECKING:  # pragma: no cover
    from hpcbench.common.data.layout import FileLayout
    from hpcbench.common.workload import Workload

#: ``hpcbench convert FORMAT``: (src, out, trust_pickle, progress, workers) -> samples converted per split
Converter = Callable[[Path, Path, bool, bool, int], dict[str, int]]


@dataclass(frozen=True)
class WorkloadEntry:
    name: str
    target: str  # "module:Class"
    benchmark: str  # MLPerf benchmark key
    summary: str
    data_module: str = ""  # module with the dataset's LAYOUT (light to import: no torch, no model)
    required_runs: int = 5  # runs the MLPerf rules require per result (mlperf_logging.benchmark_meta)
    converter: str = ""  # "module:function" (a Converter) behind `hpcbench convert NAME`; "" for none
    suite: str = "hpc"  # hpc | training (common.suites): the rules its logs and results follow
    ruleset: str = "3.0.0"  # the version of the suite's ruleset the logs are written and checked for


WORKLOADS: dict[str, WorkloadEntry] = {
    e.name: e
    for e in (
        WorkloadEntry("cosmoflow", "hpcbench.workloads.cosmoflow.workload:CosmoFlowWorkload", "cosmoflow",
                      "3D CNN regressing 4 cosmological parameters from dark-matter density cubes",
                      "hpcbench.workloads.cosmoflow.layout", required_runs=10),
        WorkloadEntry("deepcam", "hpcbench.workloads.deepcam.workload:DeepCAMWorkload", "deepcam",
                      "DeepLabv3+ segmentation of cyclones and atmospheric rivers in climate fields",
                      "hpcbench.workloads.deepcam.layout", required_runs=5),
        WorkloadEntry("oc20", "hpcbench.workloads.opencatalyst.workload:OC20Workload", "oc20",
                      "DimeNet++ energies and forces of catalyst slabs with adsorbates (OC20 S2EF)",
                      "hpcbench.workloads.opencatalyst.layout", required_runs=5, converter="hpcbench.workloads.opencatalyst.convert:convert"),
        # training 5.1.0: the newest training ruleset of the installed mlperf-logging listed for it by
        # the issue (6.0.0 also has dlrm_dcnv2; the logs pass both)
        WorkloadEntry("dlrm_dcnv2", "hpcbench.workloads.mlperf_training.dlrm_dcnv2.workload:DLRMWorkload", "dlrm_dcnv2",
                      "DLRM with a DCNv2 cross network on Criteo multi-hot clicks; exact AUROC; hybrid-parallel embeddings",
                      "hpcbench.workloads.mlperf_training.dlrm_dcnv2.dataset", required_runs=10, suite="training", ruleset="5.1.0"),
        # training 5.0.0: 5.1.0 still ships closed_bert.yaml but its common rules no longer accept bert as a
        # submission_benchmark (see mlperf_training/bert/workload.py); 5.0.0 is the newest that does
        WorkloadEntry("bert", "hpcbench.workloads.mlperf_training.bert.workload:BertWorkload", "bert",
                      "BERT-large masked-LM + next-sentence pretraining on packed HDF5 shards; masked-LM accuracy",
                      "hpcbench.workloads.mlperf_training.bert.dataset", required_runs=10, suite="training", ruleset="5.0.0"),
        # training 4.0.0: the newest training ruleset of the installed mlperf-logging that lists unet3d
        WorkloadEntry("unet3d", "hpcbench.workloads.mlperf_training.unet3d.workload:UNet3DWorkload", "unet3d",
                      "3D U-Net segmentation of kidneys and tumours in KiTS19 CT volumes; sliding-window mean Dice",
                      "hpcbench.workloads.mlperf_training.unet3d.dataset", required_runs=40, suite="training", ruleset="4.0.0"),
        # training 4.0.0: the newest training ruleset of the installed mlperf-logging that lists resnet
        WorkloadEntry("resnet", "hpcbench.workloads.mlperf_training.resnet.workload:ResNetWorkload", "resnet",
                      "ResNet-50 v1.5 image classification on ImageNet JPEG folders; top-1; LARS; Pillow or DALI loaders",
                      "hpcbench.workloads.mlperf_training.resnet.dataset", required_runs=5, suite="training", ruleset="4.0.0"),
    )
}
ALIASES = {"opencatalyst": "oc20", "oc": "oc20"}

#: benchmarks of the MLPerf HPC rules that no workload here implements yet: the runs they require
UPCOMING_REQUIRED_RUNS = {"openfold": 10}
#: runs per benchmark key demanded by the rules (same table as mlperf_logging.benchmark_meta)
REQUIRED_RUNS: dict[str, int] = {**{e.benchmark: e.required_runs for e in WORKLOADS.values()},
                                 **UPCOMING_REQUIRED_RUNS}
#: for a benchmark the rules do not list (an out-of-tree workload)
DEFAULT_REQUIRED_RUNS = 5


def names() -> list[str]:
    return list(WORKLOADS)


def entry(name: str) -> WorkloadEntry:
    key = ALIASES.get(name, name)
    if key not in WORKLOADS:
        raise HpcbenchError(f"unknown workload '{name}'; valid workloads: {', '.join(WORKLOADS)}")
    return WORKLOADS[key]


def get(name: str) -> "type[Workload]":
    """The workload class, imported now. ``package.module:Class`` names an out-of-tree workload."""
    if ":" in name:
        e = WorkloadEntry(name, name, "", "out-of-tree workload")
    else:
        e = entry(name)
    module_name, _, attr = e.target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name == module_name:
            raise HpcbenchError(f"workload '{e.name}' is registered but not implemented yet ({module_name} is missing)") from None
        raise
    return getattr(module, attr)


def required_runs(benchmark: str) -> int:
    """Runs (strong) or converged models (weak) the rules require for a result of ``benchmark``."""
    return REQUIRED_RUNS.get(benchmark, DEFAULT_REQUIRED_RUNS)


def suite_of(benchmark: str) -> tuple[str, str]:
    """(suite, ruleset) of a benchmark key; an unregistered one is taken as hpc 3.0.0."""
    for e in WORKLOADS.values():
        if e.benchmark == benchmark:
            return e.suite, e.ruleset
    return "hpc", "3.0.0"


def converter_names() -> list[str]:
    """Formats ``hpcbench convert`` accepts: the workloads that have a converter."""
    return [e.name for e in WORKLOADS.values() if e.converter]


def converter(name: str) -> Converter:
    """The converter of format ``name``, imported now."""
    e = WORKLOADS.get(ALIASES.get(name, name))
    if e is None or not e.converter:
        raise ConfigError(f"unknown format {name!r}; expected one of {', '.join(converter_names())}")
    module_name, _, attr = e.converter.partition(":")
    return getattr(importlib.import_module(module_name), attr)


def dataset_names() -> list[str]:
    """Names ``pack``/``stage --dataset`` accept: every workload's dataset, and ``generic``."""
    return [*WORKLOADS, "generic"]


def layout(name: str) -> "FileLayout":
    """The file layout of a dataset, from its workload's data module (``generic``: every file)."""
    from hpcbench.common.data.layout import GENERIC

    if name == GENERIC.name:
        return GENERIC
    key = ALIASES.get(name, name)
    if key not in WORKLOADS:
        raise ConfigError(f"--dataset: unknown dataset {name!r}; expected one of {', '.join(dataset_names())}")
    return importlib.import_module(WORKLOADS[key].data_module).LAYOUT
