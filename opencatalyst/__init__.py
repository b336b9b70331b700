"""OpenCatalyst OC20 S2EF: DimeNet++ energies and forces (MLPerf HPC)."""
