"""BERT-large (MLPerf Training ``bert``): the NVIDIA-style HDF5 pretraining format and its packed
variant, a synthetic language that writes it, the model in plain torch with packed sequences, and the
masked-LM accuracy.

Groundwork only: the workload spec, presets and registry entry come with the training-suite harness
(see ``docs/bert.md``).
"""
