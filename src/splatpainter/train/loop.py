"""The editor's training loop: one edit sequence per step, teacher-forced, state carried.

For each sequence: Stage I encodes the source asset (with gradients); the TTT fast weights start
from their learned initial values; each edit k feeds Stage II the views and signals computed
against the ground truth before it, and the predicted colours are scored against the ground truth
after it:

- per-Gaussian colour error on *all* Gaussians, the changed and the unchanged ones as two means
  (so the Gaussians no edit view sees are supervised too: 3D ground truth);
- rendered error at held-out views and one edit view, inside and outside the changed pixels
  (preservation is learned, not only enforced);

and the fast weights go on to edit k + 1, so gradients teach the state to keep earlier edits.

Every random choice of a step (which example, which hint, which loss views) derives from
(seed, step), and checkpoints hold model, optimiser and step: resuming is exact.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from appshell.atomic import atomic_write_with, remove_stale_temps
from appshell.errors import first_line
from appshell.inputs import InputFileError, load_torch
from splatpainter.assets.gaussians import map_sh_bands, rgb_to_sh_dc
from splatpainter.camera import Camera
from splatpainter.model.editor import (
    TRAIN_CHECKPOINT_FORMAT,
    CheckpointError,
    EditorModel,
    load_weights,
    save_weights,
)
from splatpainter.model.propagate import SplatGraph
from splatpainter.train.config import ConfigError, TrainConfig
from splatpainter.train.examples import (
    ensure_cache,
    example_preprocess,
    example_sample,
    example_source,
    load_example,
)

CHECKPOINT = "checkpoint.pt"
LOG = "log.jsonl"
CURVE = "loss.png"
WEIGHTS = "editor.safetensors"


def lr_at(step: int, o) -> float:
    """Linear warm-up, then cosine decay to final_lr_fraction of the peak (o: OptimConfig)."""
    if step < o.warmup_steps:
        return o.lr * (step + 1) / o.warmup_steps
    t = (step - o.warmup_steps) / max(1, o.steps - o.warmup_steps)
    f = o.final_lr_fraction + (1 - o.final_lr_fraction) * 0.5 * (1 + math.cos(math.pi * min(t, 1)))
    return o.lr * f


def make_optimizer(model: EditorModel, cfg: TrainConfig) -> torch.optim.AdamW:
    o = cfg.optim
    groups: dict[tuple[bool, bool], list[torch.nn.Parameter]] = {}
    for name, p in model.named_parameters():
        key = (name.startswith("stage1."), p.dim() >= 2)
        groups.setdefault(key, []).append(p)
    params = [
        {
            "params": ps,
            "weight_decay": o.weight_decay if decay else 0.0,
            "lr_scale": o.stage1_lr_scale if s1 else 1.0,
        }
        for (s1, decay), ps in sorted(groups.items())
    ]
    return torch.optim.AdamW(params, lr=o.lr, betas=(0.9, 0.99))


def _masked_mean(err: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    m = mask.to(err.dtype)
    return (err * m).sum() / m.sum().clamp_min(1.0)


def sequence_loss(
    model: EditorModel, ex: dict[str, Any], cfg: TrainConfig, gen: torch.Generator
) -> tuple[torch.Tensor, dict[str, float]]:
    """Loss of one teacher-forced sequence (summed over its edits) and its parts."""
    from splatpainter.render import render

    lc = cfg.loss
    source = example_source(ex)
    latent = model.stage1([source], [example_preprocess(ex)], [ex["normals"]])[0]
    if ex.get("graph") is not None:
        latent.graph = SplatGraph.from_dict(ex["graph"])
    state = model.stage2.init_state(1)
    opac = torch.sigmoid(source.opacity_logits)
    total = source.means.new_zeros(())
    parts = {"gauss_changed": 0.0, "gauss_unchanged": 0.0, "render_changed": 0.0,
             "render_unchanged": 0.0}  # fmt: skip
    for step in ex["steps"]:
        auto = float(torch.rand(1, generator=gen)) < cfg.data.auto_hint_prob
        sample = example_sample(step, latent, "auto" if auto else step["hint"])
        deltas, state = model.stage2([sample], state)
        pred = step["colors_in"] + deltas[0]["rgb"]
        err = ((pred - step["colors_gt"]) ** 2).mean(-1)
        rest_in = step["rest_in"].float()
        rest_pred = map_sh_bands(rest_in, deltas[0]["rest_map"])
        if rest_in.shape[1]:  # the view-dependent bands count as much as the base colour
            err = err + ((rest_pred - step["rest_gt"].float()) ** 2).mean((1, 2))
        err = err * opac
        changed = step["changed"]
        g_c = _masked_mean(err, changed)
        g_u = _masked_mean(err, ~changed)
        # Rendered loss at a few held-out views and the first edit view.
        cams = step["loss_cameras"]
        k = len(cams) - 1
        pick = [*torch.randperm(k, generator=gen)[: cfg.data.loss_views].tolist(), k]
        asset = source.replace(sh=torch.cat([rgb_to_sh_dc(pred)[:, None], rest_pred], 1))
        r_c = r_u = source.means.new_zeros(())
        for i in pick:
            rgb = render(asset, Camera.from_dict(cams[i])).rgb
            gt = step["loss_gt"][i].float()
            moved = (gt - step["loss_before"][i].float()).abs().amax(-1) > 2.0 / 255.0
            e = ((rgb - gt) ** 2).mean(-1)
            r_c = r_c + _masked_mean(e, moved) / len(pick)
            r_u = r_u + _masked_mean(e, ~moved) / len(pick)
        terms = (g_c, g_u, r_c, r_u)
        if lc.form == "log":  # scaled so that log and mse runs have comparable loss magnitudes
            terms = tuple(0.01 * torch.log(t + lc.eps) for t in terms)
        loss = (
            lc.gauss_changed * terms[0]
            + lc.gauss_unchanged * terms[1]
            + lc.render_changed * terms[2]
            + lc.render_unchanged * terms[3]
        )
        if lc.unseen_gate_bce > 0:
            unseen = sample.signals.in_mask_weight <= 0
            # a global map is applied everywhere (where it changes nothing, the gate is moot)
            want = torch.ones_like(changed) if step["kind"] in GATE_OPEN_KINDS else changed
            loss = loss + lc.unseen_gate_bce * unseen_gate_loss(deltas[0]["gate"], want, unseen)
        total = total + loss
        for name, v in zip(parts, (g_c, g_u, r_c, r_u), strict=True):
            parts[name] += float(v.detach())
    return total, parts


GATE_OPEN_KINDS = ("global", "relight")  # kinds whose gate is open on every Gaussian


def unseen_gate_loss(
    gate: torch.Tensor, changed: torch.Tensor, unseen: torch.Tensor
) -> torch.Tensor:
    """Binary cross-entropy of the gate on the unseen Gaussians, the changed and the unchanged
    ones as two means (LossConfig.unseen_gate_bce)."""
    g = gate.clamp(1e-6, 1 - 1e-6)
    on = _masked_mean(-g.log(), unseen & changed)
    return on + _masked_mean(-(1 - g).log(), unseen & ~changed)


def grow_state(source: EditorModel, model: EditorModel, where: str) -> dict[str, torch.Tensor]:
    """`model`'s state dict with `source`'s weights where they fit: a model that grew by the
    propagation module keeps that module's initial weights, and the heads' first layer keeps
    the source's columns with zeros for the inputs it gained (appended last), so the grown
    model starts as exactly the source's function.  Anything else is a ConfigError."""
    own = model.state_dict()
    theirs = source.state_dict()
    grown = model.config.stage2.propagate and not source.config.stage2.propagate
    out = {}
    for k, v in own.items():
        w = theirs.get(k)
        if w is not None and w.shape == v.shape:
            out[k] = w
        elif grown and k.startswith("stage2.propagation."):
            out[k] = v
        elif grown and k == "stage2.head.fc1.weight" and w is not None and w.shape[1] < v.shape[1]:
            out[k] = torch.cat([w, w.new_zeros(w.shape[0], v.shape[1] - w.shape[1])], 1)
        else:
            raise ConfigError(f"optim.init_from {where}: weights of another architecture ({k})")
    extra = sorted(set(theirs) - set(own))
    if extra:
        raise ConfigError(f"optim.init_from {where}: weights of another architecture ({extra[0]})")
    return out


def _example_order(cfg: TrainConfig, step: int) -> int:
    n = cfg.data.num_sequences
    epoch, i = divmod(step, n)
    g = torch.Generator().manual_seed(cfg.optim.seed * 1_000_003 + epoch)
    return int(torch.randperm(n, generator=g)[i])


def _save_checkpoint(out: Path, model, opt, step: int, cfg: TrainConfig) -> None:
    payload = {
        "format": TRAIN_CHECKPOINT_FORMAT,
        "step": step,
        "config": cfg.to_dict(),
        "model": model.state_dict(),
        "optim": opt.state_dict(),
    }
    atomic_write_with(out / CHECKPOINT, lambda f: torch.save(payload, f))


def _read_train_checkpoint(path: Path) -> dict[str, Any]:
    """The resume checkpoint, loaded weights-only like every torch file; a damaged one is one
    CheckpointError line naming it (delete it, or train without --resume)."""
    try:
        ck = load_torch(path, what="training checkpoint")
    except InputFileError as e:
        raise CheckpointError(str(e)) from None
    ok = isinstance(ck, dict) and ck.get("format") == TRAIN_CHECKPOINT_FORMAT
    ok = ok and isinstance(ck.get("model"), dict) and isinstance(ck.get("optim"), dict)
    if not ok or isinstance(ck.get("step"), bool) or not isinstance(ck.get("step"), int):
        raise CheckpointError(f"{path}: not a {TRAIN_CHECKPOINT_FORMAT} checkpoint")
    return ck


def _read_log(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def plot_curve(rows: list[dict[str, Any]], png: Path, phase_starts: tuple[int, ...] = ()) -> None:
    """Loss curve PNG of log rows (running means); dashed lines where a phase starts."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if not rows:
        return
    steps = [r["step"] for r in rows]

    def smooth(vals: list[float]) -> list[float]:
        w = max(1, len(vals) // 50)
        return [sum(vals[max(0, i - w + 1) : i + 1]) / len(vals[max(0, i - w + 1) : i + 1])
                for i in range(len(vals))]  # fmt: skip

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(7, 6), sharex=True)
    top.plot(steps, smooth([r["loss"] for r in rows]), label="loss (total)")
    top.set_ylabel("loss")
    top.set_title("splatpainter editor training (running mean)")
    top.legend()
    for key in ("gauss_changed", "gauss_unchanged", "render_changed", "render_unchanged"):
        bottom.plot(steps, smooth([max(r[key], 1e-8) for r in rows]), label=key)
    for ax in (top, bottom):
        for s in phase_starts:
            ax.axvline(s, color="grey", linestyle="--", linewidth=0.8)
    bottom.set_yscale("log")
    bottom.set_ylabel("mean squared error")
    bottom.set_xlabel("step")
    bottom.legend(fontsize=8)
    fig.tight_layout()
    atomic_write_with(png, lambda f: fig.savefig(f, format="png", dpi=100))
    plt.close(fig)


def train(
    cfg: TrainConfig,
    out_dir: str | os.PathLike[str],
    *,
    resume: bool = False,
    stop_after: int | None = None,
    on_cache: Callable[[int, int], None] | None = None,
    on_step: Callable[[int, dict[str, Any]], None] | None = None,
    on_phase: Callable[[int, str], None] | None = None,
    from_phase: str | None = None,
    init: str | os.PathLike[str] | None = None,
) -> EditorModel:
    """Train (or resume) and write checkpoint, JSONL log, loss curve and final safetensors.

    stop_after: stop (with a checkpoint) once this many steps are done in total, as an
    interrupted run would; `resume=True` then continues it exactly.  A config with phases trains
    each in OUT/<i>-<name>/ from the weights of the one before, steps counted over all phases,
    and writes the last phase's weights, the joined log and curve to OUT.

    from_phase / init: start the curriculum at the phase of that name from the weights `init`
    (what the phases before it produced, trained elsewhere); the earlier phases are skipped and
    their steps still counted.
    """
    with repeatable():
        return _train(
            cfg, out_dir, resume=resume, stop_after=stop_after, on_cache=on_cache,
            on_step=on_step, on_phase=on_phase, from_phase=from_phase, init=init,
        )  # fmt: skip


@contextlib.contextmanager
def repeatable():
    """Make a training run repeat bit for bit, for its duration:

    - render on one numba thread: the renderer's multi-threaded passes do not sum in the same
      order from run to run (two 30-step runs of configs/splatpainter/tiny.toml parted at step
      16 on two threads, and never on one);
    - torch's deterministic algorithms: the backward of the walk's neighbour gather
      (`z[nbr]`, an accumulating index_put_) sums in thread order on CPU (two 50-step runs of
      the editor's propagate phase parted at step 8 on two threads).

    torch keeps `optim.threads`."""
    import numba

    before = numba.get_num_threads()
    det_before = torch.are_deterministic_algorithms_enabled()
    numba.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    try:
        yield
    finally:
        numba.set_num_threads(before)
        torch.use_deterministic_algorithms(det_before)


def _train(
    cfg: TrainConfig,
    out_dir: str | os.PathLike[str],
    *,
    resume: bool,
    stop_after: int | None,
    on_cache: Callable[[int, int], None] | None,
    on_step: Callable[[int, dict[str, Any]], None] | None,
    on_phase: Callable[[int, str], None] | None,
    from_phase: str | None,
    init: str | os.PathLike[str] | None,
) -> EditorModel:
    out = Path(out_dir)
    names = [p.name for p in cfg.phases]
    if from_phase is not None and from_phase not in names:
        raise ConfigError(f"no phase named {from_phase!r}; the config has {names}")
    if (from_phase is None) != (init is None):
        raise ConfigError("starting at a later phase needs both the phase and its initial weights")
    if not cfg.phases:
        return _train_run(cfg, out, None, resume, stop_after, on_cache, on_step)
    first = names.index(from_phase) if from_phase is not None else 0
    offset = sum(p.config.optim.steps for p in cfg.phases[:first])
    init = Path(init) if init is not None else None
    rows, starts = [], []
    model = None
    for i, phase in enumerate(cfg.phases):
        if i < first:
            continue
        sub = out / f"{i + 1}-{phase.name}"
        if on_phase:
            on_phase(i, phase.name)

        def step_hook(step: int, row: dict[str, Any], offset: int = offset, name=phase.name):
            if on_step:
                on_step(offset + step, {**row, "step": offset + step, "phase": name})

        stop = None if stop_after is None else stop_after - offset
        if stop is not None and stop <= 0:
            return model if model is not None else EditorModel.initial(phase.config.model)
        model = _train_run(phase.config, sub, init, resume, stop, on_cache, step_hook)
        steps = phase.config.optim.steps
        if stop is not None and stop < steps:
            return model
        starts.append(offset)
        if steps:  # (a phase of no steps has no log)
            rows += [{**r, "step": offset + r["step"], "phase": phase.name}
                     for r in _read_log(sub / LOG)]  # fmt: skip
        offset += steps
        init = sub / WEIGHTS
    assert model is not None
    text = "".join(json.dumps(r) + "\n" for r in rows)
    atomic_write_with(out / LOG, lambda f: f.write(text.encode()))
    plot_curve(rows, out / CURVE, tuple(starts[1:]))
    phases = ",".join(p.name for p in cfg.phases[first:])
    save_weights(model, out / WEIGHTS, trained="true", steps=str(offset), phases=phases)
    return model


def _train_run(
    cfg: TrainConfig,
    out: Path,
    init_weights: Path | None,
    resume: bool,
    stop_after: int | None,
    on_cache: Callable[[int, int], None] | None,
    on_step: Callable[[int, dict[str, Any]], None] | None,
) -> EditorModel:
    """One run of one config (no phases); init_weights overrides optim.init_from."""
    out.mkdir(parents=True, exist_ok=True)
    remove_stale_temps(out)  # checkpoint/log/weights writes a killed run left unfinished
    o = cfg.optim
    if o.threads > 0:
        torch.set_num_threads(o.threads)
    model = EditorModel.initial(cfg.model, seed=o.seed).train()
    init = str(init_weights) if init_weights is not None else o.init_from
    if init:
        model.load_state_dict(grow_state(load_weights(init), model, init))
    opt = make_optimizer(model, cfg)
    start = 0
    log_path = out / LOG
    if resume and (out / CHECKPOINT).exists():
        ck = _read_train_checkpoint(out / CHECKPOINT)
        if ck.get("config") != cfg.to_dict():
            raise ConfigError(f"{out / CHECKPOINT}: written with another config; cannot resume")
        try:
            model.load_state_dict(ck["model"])
            opt.load_state_dict(ck["optim"])
        except (RuntimeError, ValueError, KeyError) as e:
            why = first_line(e)
            raise CheckpointError(f"{out / CHECKPOINT}: cannot resume from it ({why})") from None
        start = int(ck["step"])
        if log_path.exists():  # drop log lines past the checkpoint
            keep = [ln for ln in log_path.read_text().splitlines()
                    if ln.strip() and json.loads(ln)["step"] < start]  # fmt: skip
            atomic_write_with(log_path, lambda f: f.write("".join(k + "\n" for k in keep).encode()))
    elif log_path.exists():
        log_path.unlink()
    end = o.steps if stop_after is None else min(o.steps, stop_after)
    seeds = [cfg.data.first_seed + i for i in range(cfg.data.num_sequences)]
    paths: dict[int, Path] = {}
    if start < end:  # a finished run (resumed) needs no data
        done = [0]

        def tick(n: int) -> None:
            done[0] += n
            if on_cache:
                on_cache(done[0], len(seeds))

        s2 = cfg.model.stage2
        suites = cfg.data.suites
        for j, suite in enumerate(suites):
            if suite in suites[:j]:
                continue  # one cache per suite; sequence i belongs to suites[i % len]
            mine = [s for i, s in enumerate(seeds) if suites[i % len(suites)] == suite]
            paths |= ensure_cache(
                mine,
                cfg.data.sequence_spec(suite),
                cfg.model.stage1,
                cfg.data.loss_view_size,
                cfg.data.cache_dir,
                settings=s2.signal_settings(),
                graph=(s2.prop_k, s2.prop_anchors) if s2.propagate else None,
                workers=cfg.data.workers,
                progress=tick,
            )
    params = [p for g in opt.param_groups for p in g["params"]]
    t0 = time.perf_counter()
    for step in range(start, end):
        lr = lr_at(step, o)
        for g in opt.param_groups:
            g["lr"] = lr * g["lr_scale"]
        ex = load_example(paths[seeds[_example_order(cfg, step)]])
        gen = torch.Generator().manual_seed(o.seed * 7919 + step)
        loss, parts = sequence_loss(model, ex, cfg, gen)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gnorm = float(torch.nn.utils.clip_grad_norm_(params, o.grad_clip))
        opt.step()
        row = {"step": step, "loss": float(loss.detach()), **parts, "lr": lr, "grad_norm": gnorm,
               "edits": len(ex["steps"]), "seed": ex["seed"],
               "elapsed_s": round(time.perf_counter() - t0, 3)}  # fmt: skip
        if step % o.log_every == 0:
            with open(log_path, "a") as f:
                f.write(json.dumps(row) + "\n")
        if on_step:
            on_step(step, row)
        if (step + 1) % o.checkpoint_every == 0 or step + 1 == end:
            _save_checkpoint(out, model, opt, step + 1, cfg)
            plot_curve(_read_log(log_path), out / CURVE)
    model.eval()
    if end < o.steps:
        return model
    model.trained = True
    save_weights(model, out / WEIGHTS, trained="true", steps=str(o.steps))
    return model
