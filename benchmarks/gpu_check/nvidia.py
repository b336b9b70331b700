"""NVIDIA's per-GPU training rates on H100, from their public MLPerf result logs, to compare ours with.

Each figure is the training throughput of the ``tracked_stats`` lines of the named logs (median over
the epochs after the first, then over the runs), divided by the GPUs that trained one model, at
that run's local batch (global batch / GPUs of one model). Where NVIDIA's H100 logs do not hold a
figure for a workload, :data:`MISSING` says why, and the check prints that instead of a ratio.

Caveats that are part of the figure: DLRM-DCNv2 shards its embedding tables over the 8 GPUs of the
node (a per-GPU share of a model-parallel run, not one GPU holding every table); the HPC v3.0 OC20
figures are read from the strong-scaling (batch 4) and weak-scaling (batch 16) runs as quoted in
issue #29 and /work/shared/GPU.md.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Figure:
    workload: str
    local_batch: int  # samples per GPU per step in NVIDIA's run
    per_gpu: float  # samples/s per GPU (the benchmark's samples: sequences, images, volumes, rows)
    source: str  # repository, result folder, and how the number was read


HPC3 = "mlcommons/hpc_results_v3.0 NVIDIA/results"
TR31 = "mlcommons/training_results_v3.1 NVIDIA/results"
TR40 = "mlcommons/training_results_v4.0 NVIDIA/results"

FIGURES: tuple[Figure, ...] = (
    Figure("cosmoflow", 1, 200.8, f"{HPC3}/eos_n64_ngc23.09_pytorch/strong/cosmoflow: issue #29's "
                                 "figure (global batch 512 on 512 GPUs; result_0's median tracked throughput "
                                 "105.8k / 512 = 206.7)"),
    Figure("deepcam", 1, 30.0, f"{HPC3}/eos_n256_ngc23.09_pytorch/strong/deepcam: global batch "
                              "2048 on 2048 GPUs (result_0's median 63.2k / 2048 = 30.9)"),
    Figure("deepcam", 8, 81.9, f"{HPC3}/eos_n256_ngc23.09_pytorch/weak/deepcam: 16 GPUs per "
                              "instance, global batch 128 (result_0's median 1307 / 16 = 81.7)"),
    Figure("oc20", 4, 208.6, f"{HPC3}/eos_n80_ngc23.09_pytorch/strong/oc20: global batch "
                              "2048 on 512 training GPUs; 2M samples per epoch / epoch time (the log's "
                              "throughput key is not samples/s here)"),
    Figure("oc20", 16, 375.1, f"{HPC3}/eos_n256_ngc23.09_pytorch/weak/oc20: 64 GPUs per "
                               "instance, global batch 1024; 2M samples per epoch / ~84 s epoch / 64"),
    Figure("openfold", 1, 0.553, f"{HPC3}/eos_n256_ngc23.09_pytorch/weak/openfold: 70.8 samples/s per instance "
                                 "(median of 16 instances' tracked_stats after epoch 1) / 128 GPUs per instance "
                                 "(global batch 128)"),
    Figure("bert", 96, 970.0, f"{TR40}/eos_ngc23.04_pytorch/bert (1x DGX H100): 7760 sequences/s "
                              "(tracked_stats throughput, 10 runs 7755-7832) / 8 GPUs; global batch 768 sequences"),
    Figure("dlrm_dcnv2", 6912, 1.72e6, f"{TR40}/eos_ngc24.04_merlin_hugectr/dlrm_dcnv2 (1x DGX H100): 13.76M "
                                       "samples/s (10 runs 13.71-13.82M) / 8 GPUs; global batch 55296; tables "
                                       "sharded over the 8 GPUs"),
    Figure("resnet", 400, 7161.0, f"{TR40}/eos_ngc24.04_mxnet/resnet (1x DGX H100): 57.29k images/s (median epoch "
                                  "of 5 runs, first epoch 39-47k) / 8 GPUs; global batch 3200"),
    Figure("unet3d", 7, 70.6, f"{TR31}/eos_ngc23.04_mxnet/unet3d (1x DGX H100): 565 samples/s (median of "
                              "tracked_stats per run, 560-570) / 8 GPUs; global batch 56"),
)

#: workloads without an NVIDIA H100 figure, and what exists instead
MISSING: dict[str, str] = {
    "llama31_8b": "no NVIDIA H100 log (v5.1: NVIDIA submitted GB200 only); nearest H100 figure: Cisco "
                  "mlcommons/training_results_v5.1 Cisco/results/hpf_n8/llama31_8b (8x8 H100-SXM5, NeMo): "
                  "median train_step_time 0.72 s at global batch 64 x 8192 tokens = 1.39 sequences/s per GPU",
}


def figures_for(workload: str) -> list[Figure]:
    return [f for f in FIGURES if f.workload == workload]


def figure(workload: str, local_batch: int) -> Figure | None:
    return next((f for f in FIGURES if f.workload == workload and f.local_batch == local_batch), None)


def missing_reason(workload: str) -> str:
    return MISSING.get(workload, "no NVIDIA H100 per-GPU figure on record for this workload")
