"""The standard MLPerf Training workloads (suite ``training``), one sub-package per benchmark.

Grouped under one package so that no installed module is plainly named ``bert``, ``resnet`` or
``dlrm`` (names other distributions use).
"""
