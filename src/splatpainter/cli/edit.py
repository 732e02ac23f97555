"""`splatpainter edit ASSET --view CAM.json --image EDITED.png [...] --out EDITED.ply`."""

from __future__ import annotations

from pathlib import Path

import typer

from splatpainter.cli.app import app
from splatpainter.cli.info import user_errors

METHODS = ("model", "backproject", "optimize")
UNTRAINED_WARNING = (
    "warning: --method model is using untrained, deterministically seeded weights; the result "
    "is not a meaningful edit (give trained weights with --weights)"
)


def make_method(method: str, weights: Path | None, steps: int, kind: str = "auto"):
    """Build the editing method named on the command line (the model: shipped weights unless
    --weights names others)."""
    from splatpainter.edit import BackprojectMethod, ModelMethod, OptimizeMethod

    if method == "backproject":
        return BackprojectMethod()
    if method == "optimize":
        return OptimizeMethod(steps=steps)
    from splatpainter.model.editor import load_editor

    model = load_editor(weights)
    if not model.trained:
        typer.echo(UNTRAINED_WARNING, err=True)
    return ModelMethod(model, kind=kind)


@app.command()
def edit(
    asset_path: Path = typer.Argument(..., metavar="ASSET", help=".ply or .splat file"),
    view: list[Path] = typer.Option(..., help="camera JSON of an edited view (repeatable)"),
    image: list[Path] = typer.Option(..., help="edited image for the matching --view"),
    mask: list[Path] | None = typer.Option(
        None, help="mask PNG for the matching --view (none: pixels that differ from the render)"
    ),
    method: str = typer.Option("model", help="model, backproject or optimize"),
    weights: Path | None = typer.Option(
        None,
        help="editor weights (.safetensors or checkpoint) for --method model; default: shipped",
    ),
    session: Path | None = typer.Option(
        None, help="session file: continued if it exists (ASSET is then ignored), saved after"
    ),
    steps: int = typer.Option(500, help="Adam steps for --method optimize"),
    kind: str = typer.Option(
        "auto", help="edit-kind hint for --method model: auto, paint, recolor, relight, detail"
    ),
    out: Path = typer.Option(..., help="output asset (.ply or .splat)"),
) -> None:
    """Apply one edit (one or several views at once) to an asset and write the result."""
    with user_errors():
        if method not in METHODS:
            raise ValueError(f"--method must be one of {', '.join(METHODS)}, got {method!r}")
        if len(view) != len(image):
            raise ValueError(f"got {len(view)} --view but {len(image)} --image; give one per view")
        masks = list(mask or [])
        if masks and len(masks) != len(view):
            raise ValueError(
                f"got {len(masks)} --mask for {len(view)} views; give none or one each"
            )
        from splatpainter.model.stage2 import EDIT_HINTS

        if kind not in EDIT_HINTS:
            raise ValueError(f"--kind must be one of {', '.join(EDIT_HINTS)}, got {kind!r}")
        if method != "model" and weights is not None:
            raise ValueError("--weights only applies to --method model")

        from splatpainter.camera import load_camera
        from splatpainter.edit import EditSession, EditView
        from splatpainter.io import load_asset
        from splatpainter.io.images import load_image, load_mask

        views = []
        for i, (cam_path, img_path) in enumerate(zip(view, image, strict=True)):
            try:
                cam = load_camera(cam_path)
            except ValueError as e:
                raise ValueError(f"{cam_path}: {e}") from None
            m = load_mask(masks[i]) if masks else None
            views.append(EditView(cam, load_image(img_path), m, name=str(img_path)).validate())

        meth = make_method(method, weights, steps, kind)
        if session is not None and session.exists():
            sess = EditSession.load(session, meth)
        else:
            sess = EditSession(load_asset(asset_path), meth)
        sess.apply(views)
        sess.export(out)
        if session is not None:
            sess.save(session)
        changed = int(
            (sess.history[-1].asset.sh != sess.history[-2].asset.sh).flatten(1).any(1).sum()
        )
        typer.echo(
            f"{method}: edit {len(sess.history) - 1} applied in {sess.history[-1].seconds:.2f} s, "
            f"{changed} of {sess.asset.num_gaussians} Gaussians changed -> {out}"
        )
