"""What the GPU check runs per workload: the synthetic data it writes (full shapes on a GPU, tiny ones for
``--smoke``), the local batches (NVIDIA's where :mod:`.nvidia` has a figure), the config overrides that
make the full preset runnable on one GPU, and which ``data.cache`` the cache figure uses.

Workloads come from the registry at run time: one registered after this file was written gets a
default plan (its ``embedded_datagen_args``, local batch 1 on the GPU, the ``device`` cache) and is
named as such in the output, so it is measured rather than left out.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from . import nvidia


@dataclass(frozen=True)
class Plan:
    name: str
    datagen_full: tuple[str, ...]
    datagen_smoke: tuple[str, ...]
    batches_full: tuple[int, ...]
    batch_smoke: int
    overrides_full: tuple[str, ...] = ()  # --set k=v for the full preset on one GPU
    # the cache figure's data.cache (host where batches are collated again per epoch; "": none offered)
    cache: str = "device"
    note: str = ""
    default: bool = False  # True: built from the workload's class, no entry below
    modes: tuple[str, ...] = field(default=("eager", "compile", "cuda_graph"))


def _dlrm_tables() -> str:
    """The reference's 26 table sizes divided by 8: the share of the tables one GPU of NVIDIA's 8-GPU run
    holds (every table at full size is ~96 GB in fp32, more than one GPU)."""
    from hpcbench.workloads.mlperf_training.dlrm_dcnv2.criteo import CARDINALITIES

    return ",".join(str(max(1, c // 8)) for c in CARDINALITIES)


def _batches(name: str, fallback: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(f.local_batch for f in nvidia.figures_for(name)) or fallback


def _known() -> dict[str, Plan]:
    tables = _dlrm_tables()
    return {p.name: p for p in (
        Plan("cosmoflow", ("--samples", "128", "--val-samples", "16", "--size", "128", "--plain"),
             ("--samples", "16", "--val-samples", "8", "--size", "16"), _batches("cosmoflow", (1,)), 4),
        Plan("deepcam", ("--samples", "48", "--eval-samples", "8", "--height", "768", "--width", "1152"),
             ("--samples", "16", "--eval-samples", "8", "--height", "96", "--width", "144"),
             _batches("deepcam", (1,)), 4),
        Plan("oc20", ("--train", "1024", "--val", "64", "--size", "4,4,4"),  # ~70 atoms per system, as OC20
             ("--train", "16", "--val", "8", "--cutoff", "4", "--max-neighbors", "12", "--relax-steps", "0"),
             _batches("oc20", (4,)), 4, cache="host",  # smoke: the mini preset's graph (4 A, <= 12 neighbours)
             modes=("eager", "compile"), note="variable shapes: no CUDA graph; the cache keeps samples"),
        Plan("bert", ("--train-samples", "8192", "--eval-samples", "256", "--train-shards", "2"),
             ("--train-samples", "256", "--eval-samples", "32", "--train-shards", "1", "--vocab-size", "200",
              "--max-seq-len", "64"), _batches("bert", (96,)), 8,
             overrides_full=("train.division=open",), cache="host",
             note="open division: no phase-1 checkpoint loaded; packed rows: the cache keeps samples"),
        Plan("dlrm_dcnv2", ("--days", "3", "--rows-per-day", "262144", "--cardinalities", tables),
             ("--days", "3", "--rows-per-day", "2048", "--cardinalities", "200,100,50,20"),
             _batches("dlrm_dcnv2", (6912,)), 256,
             overrides_full=("data.days=0", f"model.cardinalities=[{tables}]"), cache="host",
             modes=("eager", "compile"), note="tables: the reference's sizes / 8 (one GPU's share of 8)"),
        Plan("llama31_8b", ("--train-documents", "4096", "--eval-documents", "256", "--vocab-size", "128256"),
             ("--train-documents", "48", "--eval-documents", "16", "--vocab-size", "512"), (1,), 4,
             overrides_full=("train.division=open", "data.eval_samples=16"), cache="host",
             note="8B parameters on one GPU: the full preset is not expected to fit (NVIDIA shards it over 8+)"),
        Plan("resnet", ("--classes", "1000", "--train-per-class", "4", "--val-per-class", "1", "--size", "256"),
             ("--classes", "10", "--train-per-class", "4", "--val-per-class", "2", "--size", "40"),
             _batches("resnet", (256,)), 8, cache="host", note="random crops: the cache keeps decoded samples"),
        Plan("openfold", ("--families", "8", "--members", "5", "--min-length", "256", "--max-length", "320",
                          "--msa-rows", "48"),
             ("--families", "2", "--members", "3", "--min-length", "20", "--max-length", "30", "--msa-rows", "6",
              "--pretrain-steps", "2"),  # the mini preset loads its pretrained checkpoint
             (1,), 1, overrides_full=("model.init_checkpoint=", "model.init_checkpoint_sha256=", "train.division=open"),
             cache="", modes=("eager", "compile"),
             note="open division: the reference's checkpoint is not here (random weights); no data.cache: every "
                  "epoch draws new chains, crops and MSA samples; the model reads feature values on the host "
                  "(its checks): no CUDA graph"),
        Plan("unet3d", ("--cases", "24", "--eval-cases", "2", "--min-shape", "128,128,128",
                        "--max-shape", "160,160,160"),
             ("--cases", "8", "--eval-cases", "2", "--min-shape", "32,32,32", "--max-shape", "40,40,40"),
             _batches("unet3d", (2,)), 2, cache="",
             note="no data.cache: a new random patch is cropped from each case every epoch while reading"),
    )}


def plan_for(name: str) -> Plan:
    """The plan of registered workload ``name`` (a default one for a workload this file does not know)."""
    known = _known()
    if name in known:
        return known[name]
    from hpcbench import registry

    cls = registry.get(name)
    args = tuple(cls.embedded_datagen_args())
    mini_batch = cls.load_config("mini").train.global_batch_size
    return Plan(name, args, args, _batches(name, (1,)), max(1, min(4, mini_batch)), default=True,
                note="no gpu_check plan: the mini dataset (embedded_datagen_args) at the full preset")


def workloads() -> list[str]:
    """Every registered workload, in the registry's order (new ones join without an edit here)."""
    from hpcbench import registry

    return registry.names()
