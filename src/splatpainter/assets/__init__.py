"""Gaussian assets: the data type, geometric helpers and procedural generators."""

from splatpainter.assets.gaussians import (
    SH_C0,
    AssetError,
    GaussianAsset,
    SimilarityTransform,
    convert_axes,
    normalize_to_unit_cube,
    quat_to_rotmat,
    rgb_to_sh_dc,
    rotmat_to_quat,
    sh_basis,
    sh_coeff_count,
    sh_dc_to_rgb,
    transform_asset,
    up_axis_rotation,
)
from splatpainter.assets.procedural import (
    Primitive,
    ProceduralAsset,
    Texture,
    build_asset,
    make_demo_asset,
    random_procedural_asset,
)

__all__ = [
    "SH_C0",
    "AssetError",
    "GaussianAsset",
    "Primitive",
    "ProceduralAsset",
    "SimilarityTransform",
    "Texture",
    "build_asset",
    "convert_axes",
    "make_demo_asset",
    "normalize_to_unit_cube",
    "quat_to_rotmat",
    "random_procedural_asset",
    "rgb_to_sh_dc",
    "rotmat_to_quat",
    "sh_basis",
    "sh_coeff_count",
    "sh_dc_to_rgb",
    "transform_asset",
    "up_axis_rotation",
]
