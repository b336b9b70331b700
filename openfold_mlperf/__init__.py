"""OpenFold (MLPerf HPC 3.0.0): AlphaFold2 in PyTorch trained to an average lDDT-Ca target.

Placeholder package marker written by the data side so that ``hpcbench.workloads.openfold_mlperf.data``
imports; the integrator owns this file (workload spec, registry line).
"""
