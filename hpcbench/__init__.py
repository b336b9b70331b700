"""hpcbench: an MLPerf-HPC-style benchmark suite for AI training on HPC systems."""

__version__ = "0.1.0"
