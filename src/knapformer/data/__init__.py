"""Data: the synthetic heterogeneous image/video dataset (and the shipped length files)."""
