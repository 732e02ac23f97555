"""Cost-model calibration: time real blocks, measure all-to-all bandwidth, fit by NNLS.

`fit` is pure (numpy/scipy); `clock` times a rank's own work on the device that trains;
`blocks` times the MMDiT's block types, `run` is `knapformer calibrate`, `comm` times gloo.
"""
