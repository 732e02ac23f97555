"""`splatpainter edit ASSET --view CAM.json --image EDITED.png [...] --out EDITED.ply`."""

from __future__ import annotations

from pathlib import Path

import typer

from appshell.atomic import check_outputs
from appshell.cli import JsonFlag, UserError, note, print_json, status
from appshell.inputs import check_regular_file
from splatpainter.cli.app import app
from splatpainter.cli.options import (
    EditKind,
    EditMethod,
    check_render_size,
    kernel_warmup,
    read_asset,
)

METHODS = tuple(m.value for m in EditMethod)
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
        note(UNTRAINED_WARNING)
    return ModelMethod(model, kind=kind)


@app.command()
def edit(
    asset_path: Path = typer.Argument(..., metavar="ASSET", help=".ply, .splat or .spz file"),
    view: list[Path] = typer.Option(
        ..., metavar="CAM.json", help="camera JSON of an edited view (repeatable)"
    ),
    image: list[Path] = typer.Option(
        ..., metavar="IMAGE.png", help="edited image for the matching --view (repeatable)"
    ),
    mask: list[Path] | None = typer.Option(
        None,
        metavar="MASK.png",
        help="mask PNG for the matching --view (none: pixels that differ from the render)",
    ),
    method: EditMethod = typer.Option("model", help="editing method"),
    weights: Path | None = typer.Option(
        None,
        help="editor weights (.safetensors or checkpoint) for --method model; default: shipped",
    ),
    session: Path | None = typer.Option(
        None, help="session file: continued if it exists (ASSET is then ignored), saved after"
    ),
    steps: int = typer.Option(500, min=0, help="Adam steps for --method optimize"),
    kind: EditKind = typer.Option("auto", help="edit-kind hint for --method model"),
    out: Path = typer.Option(..., help="output asset (.ply, .splat or .spz)"),
    json_out: JsonFlag = False,
) -> None:
    """Apply one edit (one or several views at once) to an asset and write the result."""
    method, kind = method.value, kind.value
    if len(view) != len(image):
        raise UserError(f"got {len(view)} --view but {len(image)} --image; give one per view")
    masks = list(mask or [])
    if masks and len(masks) != len(view):
        raise UserError(f"got {len(masks)} --mask for {len(view)} views; give none or one each")
    from splatpainter.model.stage2 import EDIT_HINTS

    if kind not in EDIT_HINTS:
        raise UserError(f"--kind must be one of {', '.join(EDIT_HINTS)}, got {kind!r}")
    if method != "model" and weights is not None:
        raise UserError("--weights only applies to --method model")
    if out.suffix.lower() not in (".ply", ".splat", ".spz"):
        raise UserError(f"--out {out}: unknown asset format; use .ply, .splat or .spz")
    # Every output path is checked before anything is written (a bad --session must not
    # leave --out written), and an existing session must be a regular file.
    check_outputs(out, session)
    if session is not None and session.exists():
        check_regular_file(session, what="session file")

    from splatpainter.camera import load_camera
    from splatpainter.edit import EditSession, EditView
    from splatpainter.io.images import load_image, load_mask

    views = []
    for i, (cam_path, img_path) in enumerate(zip(view, image, strict=True)):
        cam = load_camera(cam_path)  # CameraError names the file
        check_render_size(cam.width, cam.height, f"--view {cam_path}: camera size")
        m = load_mask(masks[i]) if masks else None
        views.append(EditView(cam, load_image(img_path), m, name=str(img_path)).validate())

    with status("loading the editor"):
        meth = make_method(method, weights, steps, kind)
    if session is not None and session.exists():
        with status(f"reading the session {session}"):
            sess = EditSession.load(session, meth)
    else:
        extras = {}
        if asset_path.suffix.lower() == ".ply":  # normals etc. come back in the output, as convert
            from splatpainter.io.ply import read_ply_with_extras

            extras = read_ply_with_extras(asset_path, notes=[])[1]  # notes: given by read_asset
        source = read_asset(asset_path)
        # the model's Stage I runs here (tens of seconds at 1M Gaussians; read back from the
        # latent cache when the asset was opened before)
        with status(f"opening {asset_path.name} ({source.num_gaussians:,} Gaussians)"):
            sess = EditSession(source, meth, extras)
    if sess.asset.num_gaussians == 0:
        raise UserError("the asset has no Gaussians: nothing to edit")
    kernel_warmup()
    with status(f"applying the edit ({method})"):
        sess.apply(views)
    notes: list[str] = []  # what an .spz's quantisation clipped
    with status(f"writing {out}"):
        sess.export(out, notes)
    for line in notes:
        note(line)
    if session is not None:
        with status(f"saving the session {session}"):
            sess.save(session)
    changed = int((sess.history[-1].asset.sh != sess.history[-2].asset.sh).flatten(1).any(1).sum())
    reading = getattr(sess.method, "reading", None) if kind == "auto" else None
    result = {
        "method": method,
        "edit": len(sess.history) - 1,
        "seconds": sess.history[-1].seconds,
        "changed_gaussians": changed,
        "num_gaussians": sess.asset.num_gaussians,
        "out": str(out),
        "session": None if session is None else str(session),
        "notes": notes,
        "reading": reading,  # how --kind auto read the edit (None: a kind was given)
    }
    if json_out:
        print_json(result)
        return
    typer.echo(
        f"{method}: edit {result['edit']} applied in {result['seconds']:.2f} s, "
        f"{changed} of {result['num_gaussians']} Gaussians changed -> {out}"
    )
    if reading is not None:
        typer.echo(describe_reading(reading))


def describe_reading(reading: dict) -> str:
    """One line on how `--kind auto` read an edit, with the way to say otherwise."""
    shares = ", ".join(f"{k} {100 * v:.0f}%" for k, v in reading["shares"].items())
    line = (
        f"read as {reading['read_as']} ({shares} of the edit's weight); "
        f"{reading['moved_beyond_the_mask']} of the {reading['moved_gaussians']} Gaussians it "
        "moved lie outside what the edited pixels show"
    )
    if reading["read_as"] != "paint" and reading["moved_beyond_the_mask"] > 0:
        line += "; for a stroke meant to stay where it was painted, pass --kind paint"
    return line
