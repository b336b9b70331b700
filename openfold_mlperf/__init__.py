"""OpenFold (MLPerf HPC 3.0.0): AlphaFold2 in plain torch, trained from a pinned checkpoint to an average
lDDT-Ca target. Data formats and features in ``data/`` (schema ``features.py``), the model, losses and
checkpoint in ``model/``; the workload glue is being integrated."""
