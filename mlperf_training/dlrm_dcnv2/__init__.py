"""DLRM-DCNv2 (MLPerf Training ``dlrm_dcnv2``): the Criteo multi-hot on-disk format, its synthetic
generator, the DCNv2 model, exact AUROC and hybrid-parallel embeddings.

Groundwork only: the workload spec, presets and registry entry come with the training-suite harness
(see ``docs/dlrm_dcnv2.md``).
"""
