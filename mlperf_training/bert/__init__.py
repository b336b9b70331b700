"""MLPerf Training BERT-large, registered as workload ``bert`` of the training suite (ruleset training
5.0.0): the NVIDIA-style HDF5 format (padded and packed), a synthetic language, the model with packed
sequences, masked-LM accuracy, and the workload on the shared harness (``workload.py``).
See docs/bert.md.
"""
