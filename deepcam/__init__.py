"""DeepCAM: segmentation of extreme weather in climate simulations (MLPerf HPC)."""
