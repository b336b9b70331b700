"""Shared machinery every workload uses: config, distributed setup, MLPerf logging, timing, the
workload contract and the training harness. Nothing here imports a workload package."""
