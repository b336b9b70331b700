"""GPU check: where the suite stands on one GPU, in one run and one results file (issue #29).

For every registered workload (read from the registry at run time) at NVIDIA's local batches where
their H100 logs give a per-GPU figure (:mod:`.nvidia`): the training step alone in eager, compile and
(static shapes) CUDA-graph mode, with FLOPs per sample counted on one step and the FLOP/s achieved
against the machine's bf16 GEMM peak; ``hpcbench train`` end to end from the staged files through
the loader and the host-to-device copy (``data.cache=none``), and separately from the cache
(``data.cache=device`` or ``host``); each beside NVIDIA's per-GPU figure and the ratio. Before them,
the GPU test suite (:mod:`.suite`), counted. One text file and its JSON (:mod:`.report`).

    python -m benchmarks.gpu_check --out benchmarks/results/gpu_check_$(date +%F)_h100
    python -m benchmarks.gpu_check --smoke --out /tmp/x     # the same code on the CPU, mini presets

``benchmarks/gpu_session.sh`` runs it on a lent GPU machine in parts of under 10 minutes and merges them.
"""
