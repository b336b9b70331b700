"""3D U-Net (MLPerf Training ``unet3d``, training suite): the KiTS19 preprocessed on-disk format, its
synthetic generator (kidneys and tumours), the reference model, Dice + cross-entropy loss, sliding-window
evaluation and the workload spec (``workload.py``, presets in ``configs/``; see ``docs/unet3d.md``).
"""
