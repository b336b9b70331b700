"""CosmoFlow: 3D CNN regression of cosmological parameters (MLPerf HPC)."""
