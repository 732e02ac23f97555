"""SplatPainter: interactive editing of 3D Gaussian Splatting assets from 2D edits."""

__version__ = "0.1.0"
