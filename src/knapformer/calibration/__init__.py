"""Cost-model calibration: time real blocks, measure all-to-all bandwidth, fit by NNLS.

`fit` is pure (numpy/scipy); `timing` and `comm` touch torch and processes.
"""
