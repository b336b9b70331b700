"""`hpcbench report`: scores, tables and plots from MLPerf HPC result logs.

* :mod:`.logs` parses one MLLOG file into a :class:`~.logs.RunLog` (our own parser);
* :mod:`.discover` finds the logs of a results tree (the official submission layout);
* :mod:`.scoring` applies the MLPerf HPC rules: strong scaling (olympic mean of time to solution)
  and weak scaling (T, S, M', TTTa, models per minute);
* :mod:`.official` runs the official compliance checker and result summarizer on the same files;
* :mod:`.compare` puts both side by side and lists every disagreement;
* :mod:`.tables` (terminal, JSON, CSV) and :mod:`.plots` (PNG) write the outputs.
"""
