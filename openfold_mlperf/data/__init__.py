"""OpenFold data: readers of the reference's formats (mmCIF, A3M, HHR, its preprocessed caches),
feature construction as the reference does it, and the synthetic generator."""
