"""Staging layer: pack datasets into compressed shards, plan who reads what, distribute with MPI."""
