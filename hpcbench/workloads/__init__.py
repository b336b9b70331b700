"""The workloads, one package each: ``hpcbench.workloads.cosmoflow``, ``.deepcam``, ``.opencatalyst`` (suite
hpc) and ``.mlperf_training.*`` (suite training). In the repository they are the top-level folders of the
same names (:mod:`hpcbench._folders`); :mod:`hpcbench.registry` says which workload lives where."""
