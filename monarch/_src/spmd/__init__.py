"""Bridges between SPMD scripts (torchrun-style ranks) and actor meshes."""
