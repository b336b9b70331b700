"""`hpcbench report`: scores, tables and plots from MLPerf HPC result logs.

* :mod:`.logs` parses one MLLOG file into a :class:`~.logs.RunLog` (our own parser);
* :mod:`.discover` finds the logs of a results tree (the official submission layout);
* :mod:`.scoring` applies the MLPerf HPC rules: strong scaling (olympic mean of time to solution)
  and weak scaling (T, S, M', TTTa, models per minute);
* :mod:`.targets` holds the quality targets as the official compliance checker defines them;
* :mod:`.official` runs the official compliance checker on every log and the result summarizer,
  package checker and system-description checker as command-line tools on the submission folder;
* :mod:`.closed` judges each log of a folder that claims the closed division against the benchmark's closed
  definition (parameter count, dataset sample counts, fixed hyperparameters, divisions);
* :mod:`.compare` puts both side by side, lists every disagreement and gives the verdict;
* :mod:`.prune` moves failed weak-scaling instances' logs aside (``report --prune-failed``);
* :mod:`.tables` (terminal, JSON, CSV) and :mod:`.plots` (PNG) write the outputs.
"""
