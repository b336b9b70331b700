"""OpenFold (MLPerf HPC 3.0): AlphaFold2 in plain torch. Placeholder package marker; the integrator owns this file."""
