"""Edit views (camera + edited image + optional mask): validation and the default mask."""

from __future__ import annotations

from dataclasses import dataclass

import torch

# Default mask: a pixel counts as edited when some channel of (edited - current render) differs
# by more than 2/255.  Saving a float render to an 8-bit PNG and reading it back moves a pixel by
# at most 0.5/255, so untouched pixels of a round-tripped render never trigger the mask, while
# any deliberate change of 1% or more does.
MASK_THRESHOLD = 2.0 / 255.0


class EditInputError(ValueError):
    """An edit view that cannot be used (shape/size/value problems); the message names it."""


@dataclass
class EditView:
    """One edited view: `image` [H, W, 3] in [0, 1] seen from `camera`; `mask` [H, W] in [0, 1].

    mask=None means "pixels that differ from the current render" (see MASK_THRESHOLD).
    """

    camera: object
    image: torch.Tensor
    mask: torch.Tensor | None = None
    name: str = ""

    def validate(self) -> EditView:
        cam = self.camera
        h, w = int(cam.height), int(cam.width)
        img = self.image
        label = f"edit view {self.name!r}" if self.name else "edit view"
        if not isinstance(img, torch.Tensor) or img.dim() != 3 or img.shape[-1] != 3:
            shape = tuple(img.shape) if isinstance(img, torch.Tensor) else type(img).__name__
            raise EditInputError(f"{label}: image must be [H, W, 3], got {shape}")
        if tuple(img.shape[:2]) != (h, w):
            raise EditInputError(
                f"{label}: image is {img.shape[1]}x{img.shape[0]} (WxH) but the camera is {w}x{h}"
            )
        if not img.is_floating_point() or not bool(torch.isfinite(img).all()):
            raise EditInputError(f"{label}: image must be finite floats")
        if float(img.min()) < 0 or float(img.max()) > 1:
            raise EditInputError(f"{label}: image values must be in [0, 1]")
        if self.mask is not None:
            m = self.mask
            if not isinstance(m, torch.Tensor) or tuple(m.shape) != (h, w):
                shape = tuple(m.shape) if isinstance(m, torch.Tensor) else type(m).__name__
                raise EditInputError(f"{label}: mask must be [{h}, {w}] (H, W), got {shape}")
            mf = m.float()
            if not bool(torch.isfinite(mf).all()) or float(mf.min()) < 0 or float(mf.max()) > 1:
                raise EditInputError(f"{label}: mask values must be in [0, 1]")
        return self

    def to_dict(self) -> dict:
        return {
            "camera": self.camera.to_dict(),
            "image": self.image.detach().cpu(),
            "mask": None if self.mask is None else self.mask.detach().cpu(),
            "name": self.name,
        }

    @classmethod
    def from_dict(cls, d: dict) -> EditView:
        from splatpainter.camera import Camera

        return cls(Camera.from_dict(d["camera"]), d["image"], d.get("mask"), d.get("name", ""))


def default_mask(edited: torch.Tensor, rendered: torch.Tensor) -> torch.Tensor:
    """[H, W] float mask of pixels whose max-channel |edited - rendered| exceeds MASK_THRESHOLD."""
    return ((edited - rendered).abs().amax(-1) > MASK_THRESHOLD).to(edited.dtype)


def pixel_box(mask: torch.Tensor) -> tuple[int, int, int, int] | None:
    """(x0, y0, x1, y1), inclusive: the box of the pixels of an [H, W] image with mask > 0
    (None: none), the window a crop of the view needs (`Camera.cropped`)."""
    pix = (mask > 0).nonzero()
    if pix.numel() == 0:
        return None
    (y0, x0), (y1, x1) = pix.min(0).values.tolist(), pix.max(0).values.tolist()
    return x0, y0, x1, y1


def effective_mask(view: EditView, rendered: torch.Tensor) -> torch.Tensor:
    """The view's own mask (as float), or the default mask against the current render."""
    if view.mask is None:
        return default_mask(view.image.to(rendered), rendered)
    return view.mask.to(rendered.dtype).to(rendered.device)
