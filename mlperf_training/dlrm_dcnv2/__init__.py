"""DLRM-DCNv2 (MLPerf Training ``dlrm_dcnv2``, training suite): the Criteo multi-hot on-disk format, its
synthetic generator, the DCNv2 model, exact AUROC, hybrid-parallel embeddings, and the workload spec
(``workload.py``, presets in ``configs/``; see ``docs/dlrm_dcnv2.md``).
"""
