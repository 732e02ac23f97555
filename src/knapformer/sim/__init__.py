"""Simulator: the paper's data codes and a side-by-side comparison of balancing strategies.

Pure numpy; the `knapformer simulate` command is a thin shell over it.
"""
