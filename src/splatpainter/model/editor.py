"""The full editing model (Stage I + Stage II), its config and its checkpoint format.

Checkpoint = torch.save of a plain dict

    {"format": "splatpainter-editor", "version": 1, "config": asdict(EditorConfig),
     "state_dict": {...}}

written atomically (temp file in the same directory + os.replace).  Loading checks the format
tag, rebuilds the model from the stored config and loads the weights strictly; any mismatch is a
`CheckpointError` naming the offending config field or parameter.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
from torch import nn

from appshell.atomic import atomic_write_with
from appshell.errors import first_line
from appshell.inputs import InputFileError, check_regular_file, load_torch, loads_json
from appshell.tables import dataclass_from_table
from splatpainter.model.latent_cache import LatentCache, cache_key
from splatpainter.model.stage1 import (
    PreprocessViews,
    Stage1Config,
    Stage1Encoder,
    Stage1Latent,
    asset_content_hash,
    render_preprocess_views,
)
from splatpainter.model.stage2 import Stage2Config, Stage2Editor

CHECKPOINT_FORMAT = "splatpainter-editor"
TRAIN_CHECKPOINT_FORMAT = "splatpainter-train"  # what `splatpainter train` writes
CHECKPOINT_VERSION = 1
DEFAULT_SEED = 0


DISK_CACHE_MIN_GAUSSIANS = 50_000


def check_latent(latent: Stage1Latent, n: int, config: EditorConfig) -> None:
    """ValueError naming the first part of a (cached) latent that does not fit an asset of n
    Gaussians and this editor's config."""
    c1, c2 = config.stage1, config.stage2
    want = {
        "gauss_voxel": (latent.vox.gauss_voxel, (n,)),
        "gauss_feat": (latent.gauss_feat, (n, c1.gauss_feat_dim)),
        "voxel_latent": (latent.voxel_latent, (latent.vox.num_voxels, c1.latent_dim)),
    }
    if latent.normals is not None:
        want["normals"] = (latent.normals, (n, 3))
    g = latent.graph
    if c2.propagate:
        if g is None:
            raise ValueError("no graph")
        want |= {
            "graph.fine_idx": (g.fine_idx, (n, c2.prop_k)),
            "graph.points": (g.points, (n, 3)),
            "graph.up_idx": (g.up_idx, (n, g.up_idx.shape[1])),
            "graph.attrs": (g.attrs, (n, g.attrs.shape[1])),
        }
    for name, (t, shape) in want.items():
        if tuple(t.shape) != shape:
            raise ValueError(f"{name} has shape {tuple(t.shape)}, expected {shape}")
    idx = [(latent.vox.gauss_voxel, latent.vox.num_voxels)]
    if g is not None:
        idx += [(g.fine_idx, n), (g.anchors, n), (g.up_idx, g.anchors.numel())]
        idx += [(g.coarse_idx, g.anchors.numel())]
    for t, bound in idx:
        if t.numel() and (int(t.min()) < 0 or int(t.max()) >= bound):
            raise ValueError("an index out of range")


class CheckpointError(ValueError):
    """A checkpoint that is not ours, or whose weights do not fit the architecture."""


@dataclass
class EditorConfig:
    """Both stages' configs; Stage I's latent and Gaussian-feature widths feed Stage II."""

    stage1: Stage1Config = field(default_factory=Stage1Config)
    stage2: Stage2Config = field(default_factory=Stage2Config)

    def __post_init__(self) -> None:
        if isinstance(self.stage1, dict):
            self.stage1 = Stage1Config(**self.stage1)
        if isinstance(self.stage2, dict):
            self.stage2 = Stage2Config(**self.stage2)
        if self.stage1.gauss_feat_dim != self.stage2.gauss_feat_dim:
            raise ValueError(
                f"stage1.gauss_feat_dim ({self.stage1.gauss_feat_dim}) != "
                f"stage2.gauss_feat_dim ({self.stage2.gauss_feat_dim})"
            )

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> EditorConfig:
        """Rebuild from asdict(); unknown fields are an error naming them."""
        if not isinstance(d, dict):
            raise CheckpointError(f"invalid editor config: expected a table, got {d!r:.60}")
        try:
            s1 = dataclass_from_table(Stage1Config, d.get("stage1", {}), "stage1")
            s2 = dataclass_from_table(Stage2Config, d.get("stage2", {}), "stage2")
            return cls(stage1=s1, stage2=s2)
        except (TypeError, ValueError) as e:
            raise CheckpointError(f"invalid editor config: {e}") from None


class EditorModel(nn.Module):
    """Stage I encoder + Stage II editor, with a per-asset Stage I cache."""

    def __init__(self, config: EditorConfig | None = None) -> None:
        super().__init__()
        self.config = config or EditorConfig()
        self.stage1 = Stage1Encoder(self.config.stage1)
        self.stage2 = Stage2Editor(self.config.stage2, self.config.stage1.latent_dim)
        self._cache: dict[str, Stage1Latent] = {}
        self.trained = False  # set by load_weights from the file's metadata
        # Stage I latents of large assets persist on disk (None: never); small ones encode in
        # well under a second and are not worth the disk.
        self.latent_cache: LatentCache | None = LatentCache.from_env()
        self.disk_cache_min_gaussians = DISK_CACHE_MIN_GAUSSIANS
        self.open_timings: dict[str, float] = {}  # seconds of the last Stage I run, by part

    @classmethod
    def initial(cls, config: EditorConfig | None = None, seed: int = DEFAULT_SEED) -> EditorModel:
        """Deterministically seeded, untrained weights (same seed -> same weights)."""
        state = torch.random.get_rng_state()
        try:
            torch.manual_seed(seed)
            model = cls(config)
        finally:
            torch.random.set_rng_state(state)
        return model.eval()

    def with_stage2(self, **changes: Any) -> EditorModel:
        """The same weights under a Stage II config with `changes` (inference options such as
        the walk's length; the architecture must stay), in eval mode, sharing the disk cache."""
        config = replace(self.config, stage2=replace(self.config.stage2, **changes))
        other = EditorModel(config)
        other.load_state_dict(self.state_dict())
        other.trained = self.trained
        other.latent_cache = self.latent_cache
        return other.eval()

    def num_parameters(self) -> dict[str, int]:
        def count(m: nn.Module) -> int:
            return sum(p.numel() for p in m.parameters())

        return {"stage1": count(self.stage1), "stage2": count(self.stage2), "total": count(self)}

    def weights_fingerprint(self) -> str:
        import hashlib

        h = hashlib.sha256()
        for k, v in self.state_dict().items():
            h.update(k.encode())
            h.update(v.detach().cpu().contiguous().numpy().tobytes())
        return h.hexdigest()[:16]

    def preprocess(self, asset) -> PreprocessViews:
        return render_preprocess_views(asset, self.config.stage1)

    def asset_graph(self, asset):
        """The k-NN graph Stage II propagates over (None when it does not propagate)."""
        from splatpainter.model.propagate import build_graph

        c = self.config.stage2
        return build_graph(asset, c.prop_k, c.prop_anchors) if c.propagate else None

    @torch.no_grad()
    def encode_asset(self, asset) -> Stage1Latent:
        """Stage I for one asset, cached by (asset content, weights) hash: in memory (the
        last asset), and on disk (`latent_cache`) for assets of `disk_cache_min_gaussians` or
        more, so a session reopened on a large asset does not pay for Stage I again."""
        content = asset_content_hash(asset)
        fingerprint = self.weights_fingerprint()
        key = content + ":" + fingerprint
        hit = self._cache.get(key)
        if hit is not None:
            return hit
        disk = self.latent_cache if asset.num_gaussians >= self.disk_cache_min_gaussians else None
        if disk is None:
            hit = self._encode(asset)
        else:
            dkey = cache_key(content, fingerprint, json.dumps(asdict(self.config), sort_keys=True))
            hit = self._read_cached(disk, dkey, asset)
            if hit is None:
                hit = self._encode(asset)
                disk.put(dkey, hit.to_dict(), wait=False)  # the session need not wait
        self._cache = {key: hit}  # one asset at a time is what a session needs
        return hit

    def _encode(self, asset) -> Stage1Latent:
        """Stage I and, alongside it in a second thread, the k-NN graph (it needs only the
        centres; scipy's queries release the GIL and fill the cores Stage I's serial parts
        leave idle)."""
        from concurrent.futures import ThreadPoolExecutor

        def graph():
            with torch.no_grad():  # (grad mode is per thread)
                t = time.perf_counter()
                return self.asset_graph(asset), time.perf_counter() - t

        t0 = time.perf_counter()
        with ThreadPoolExecutor(1, thread_name_prefix="asset-graph") as pool:
            pending = pool.submit(graph)
            views = self.preprocess(asset)
            t1 = time.perf_counter()
            latent = self.stage1([asset], [views])[0].detach()
            t2 = time.perf_counter()
            latent.graph, t_graph = pending.result()
        release_freed_memory()  # (the graph thread's malloc arena keeps what it freed)
        self.open_timings = {
            "preprocess_renders": t1 - t0,
            "stage1_encoder_and_normals": t2 - t1,
            "knn_graph_alongside": t_graph,
            "knn_graph_wait": time.perf_counter() - t2,
        }
        return latent

    def _read_cached(self, disk: LatentCache, dkey: str, asset) -> Stage1Latent | None:
        """The disk entry as a latent, or None; one that does not fit the asset is discarded."""
        data = disk.get(dkey)
        if data is None:
            return None
        try:
            latent = Stage1Latent.from_dict(data, asset.device)
            check_latent(latent, asset.num_gaussians, self.config)
        except (KeyError, TypeError, ValueError, AttributeError, RuntimeError) as e:
            disk.discard(dkey, first_line(e))
            return None
        return latent


def release_freed_memory() -> None:
    """Hand the memory the C allocator holds free back to the system (glibc's malloc_trim;
    elsewhere nothing): each thread that allocated gets its own arena, which keeps what was
    freed in it, so a second thread at 1M Gaussians would leave ~0.2-0.4 GB resident."""
    import contextlib
    import ctypes
    import ctypes.util

    with contextlib.suppress(OSError, AttributeError, TypeError):
        ctypes.CDLL(ctypes.util.find_library("c")).malloc_trim(0)


# ------------------------------------------------------------------------- checkpoints
def save_checkpoint(model: EditorModel, path: str | os.PathLike[str], **extra: Any) -> None:
    """Atomically write the model's checkpoint dict (extra keys are stored alongside)."""
    payload = {
        "format": CHECKPOINT_FORMAT,
        "version": CHECKPOINT_VERSION,
        "config": asdict(model.config),
        "state_dict": {k: v.detach().cpu() for k, v in model.state_dict().items()},
        **extra,
    }
    atomic_torch_save(payload, path)


def atomic_torch_save(obj: Any, path: str | os.PathLike[str]) -> None:
    """torch.save to a temp file in the target directory, then os.replace over `path`."""
    atomic_write_with(path, lambda f: torch.save(obj, f))


def _from_training_checkpoint(payload: dict[str, Any], path) -> dict[str, Any]:
    """The editor envelope of a `splatpainter train` checkpoint (its model part): a run's
    latest checkpoint can be evaluated or used while the run goes on."""
    config, state = payload.get("config"), payload.get("model")
    if not isinstance(config, dict) or not isinstance(config.get("model"), dict):
        raise CheckpointError(f"{path}: training checkpoint has no model config")
    if not isinstance(state, dict):
        raise CheckpointError(f"{path}: training checkpoint has no model weights")
    return {
        "format": CHECKPOINT_FORMAT,
        "version": CHECKPOINT_VERSION,
        "config": config["model"],
        "state_dict": state,
        "trained": True,
        "step": payload.get("step"),
    }


def read_checkpoint(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Load and check the envelope of a checkpoint file (not the weights)."""
    try:
        payload = load_torch(path, what="checkpoint")
    except InputFileError as e:
        raise CheckpointError(str(e)) from None
    if isinstance(payload, dict) and payload.get("format") == TRAIN_CHECKPOINT_FORMAT:
        payload = _from_training_checkpoint(payload, path)
    if not isinstance(payload, dict) or payload.get("format") != CHECKPOINT_FORMAT:
        got = payload.get("format") if isinstance(payload, dict) else type(payload).__name__
        raise CheckpointError(f"{path}: not a {CHECKPOINT_FORMAT} checkpoint (format={got!r})")
    if int(payload.get("version", -1)) > CHECKPOINT_VERSION:
        raise CheckpointError(
            f"{path}: checkpoint version {payload.get('version')} is newer than supported "
            f"({CHECKPOINT_VERSION})"
        )
    for key in ("config", "state_dict"):
        if not isinstance(payload.get(key), dict):
            raise CheckpointError(f"{path}: checkpoint has no '{key}' dict")
    return payload


def check_state_dict(model: nn.Module, state_dict: dict[str, torch.Tensor], source: str) -> None:
    """Raise CheckpointError naming the first missing/unexpected/mis-shaped parameter."""
    check_shapes(
        {k: tuple(v.shape) for k, v in model.state_dict().items()},
        {k: tuple(v.shape) for k, v in state_dict.items()},
        source,
    )


def check_shapes(
    own: dict[str, tuple[int, ...]], theirs: dict[str, tuple[int, ...]], source: str
) -> None:
    """check_state_dict on shapes alone: a file's declared shapes can be checked against a
    model built on the meta device before either is allocated."""
    missing = [k for k in own if k not in theirs]
    unexpected = [k for k in theirs if k not in own]
    shapes = [
        f"{k}: checkpoint {theirs[k]} vs model {v}"
        for k, v in own.items()
        if k in theirs and theirs[k] != v
    ]
    problems = []
    if shapes:
        problems.append(
            f"shape mismatch {shapes[0]}" + (f" (+{len(shapes) - 1} more)" * (len(shapes) > 1))
        )
    if missing:
        problems.append(
            f"missing {missing[0]}" + (f" (+{len(missing) - 1} more)" * (len(missing) > 1))
        )
    if unexpected:
        problems.append(
            f"unexpected {unexpected[0]}"
            + (f" (+{len(unexpected) - 1} more)" * (len(unexpected) > 1))
        )
    if problems:
        raise CheckpointError(
            f"{source}: weights do not fit the architecture: " + "; ".join(problems)
        )


def expected_shapes(config: EditorConfig) -> dict[str, tuple[int, ...]]:
    """The state_dict shapes of the model `config` describes, built on the meta device so
    nothing is allocated: a file is checked against them before its model is built."""
    with torch.device("meta"):
        return {k: tuple(v.shape) for k, v in EditorModel(config).state_dict().items()}


def load_checkpoint(path: str | os.PathLike[str]) -> EditorModel:
    """Build the model the checkpoint describes and load its weights."""
    payload = read_checkpoint(path)
    config = EditorConfig.from_dict(payload["config"])
    state = payload["state_dict"]
    if not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise CheckpointError(f"{path}: checkpoint state_dict holds non-tensors")
    check_shapes(expected_shapes(config), {k: tuple(v.shape) for k, v in state.items()}, str(path))
    model = EditorModel(config)
    check_state_dict(model, payload["state_dict"], str(path))
    model.load_state_dict(payload["state_dict"])
    model.trained = bool(payload.get("trained", False))
    return model.eval()


def load_weights_into(model: EditorModel, path: str | os.PathLike[str]) -> EditorModel:
    """Load a checkpoint into an existing model; config or weight mismatches are named."""
    payload = read_checkpoint(path)
    ours = asdict(model.config)
    theirs = asdict(EditorConfig.from_dict(payload["config"]))
    diffs = [
        f"{stage}.{k}: checkpoint {theirs[stage][k]!r} vs model {v!r}"
        for stage in ("stage1", "stage2")
        for k, v in ours[stage].items()
        if theirs[stage].get(k) != v
    ]
    if diffs:
        raise CheckpointError(
            f"{path}: architecture mismatch: {diffs[0]}"
            + (f" (+{len(diffs) - 1} more)" if len(diffs) > 1 else "")
        )
    check_state_dict(model, payload["state_dict"], str(path))
    model.load_state_dict(payload["state_dict"])
    return model


# ------------------------------------------------------------------------- shipped weights
WEIGHTS_FORMAT = "splatpainter-editor-weights"
DEFAULT_WEIGHTS = Path(__file__).resolve().parent.parent / "data" / "editor.safetensors"


def save_weights(model: EditorModel, path: str | os.PathLike[str], **meta: str) -> None:
    """Atomically write the weights as safetensors, the config and `meta` in its metadata."""
    from safetensors.torch import save

    tensors = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    metadata = {"format": WEIGHTS_FORMAT, "config": json.dumps(asdict(model.config)), **meta}
    blob = save(tensors, metadata=metadata)
    atomic_write_with(path, lambda f: f.write(blob))


def load_weights(path: str | os.PathLike[str]) -> EditorModel:
    """Build the model a safetensors (or torch checkpoint) file describes and load its weights.

    Any mismatch (another architecture, a foreign file) is a CheckpointError naming it.
    """
    p = Path(path)
    try:
        check_regular_file(p, what="weights file")
    except InputFileError as e:
        raise CheckpointError(str(e)) from None
    if p.suffix != ".safetensors":
        return load_checkpoint(p)
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(p), framework="pt") as f:
            # The config and the declared shapes are checked before any tensor is read or any
            # model built: a tiny file's metadata can otherwise ask for gigabytes of weights.
            meta = f.metadata() or {}
            config = _weights_config(meta, p)
            shapes = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}  # noqa: SIM118
            check_shapes(expected_shapes(config), shapes, str(p))
            tensors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 (not a dict)
    except OSError as e:
        raise CheckpointError(f"{p}: cannot read ({e.strerror or e})") from None
    except (SafetensorError, ValueError) as e:
        if isinstance(e, CheckpointError):
            raise
        raise CheckpointError(f"{p}: not a readable safetensors file ({e})") from None
    model = EditorModel(config)
    check_state_dict(model, tensors, str(p))
    model.load_state_dict(tensors)
    model.trained = meta.get("trained", "false") == "true"
    return model.eval()


def _weights_config(meta: dict[str, str], p: Path) -> EditorConfig:
    """The editor config in a weights file's metadata, within the configs' stated limits."""
    if meta.get("format") != WEIGHTS_FORMAT or "config" not in meta:
        raise CheckpointError(f"{p}: not a {WEIGHTS_FORMAT} file (no editor config in metadata)")
    try:
        return EditorConfig.from_dict(loads_json(meta["config"], source="editor config"))
    except (InputFileError, CheckpointError) as e:
        raise CheckpointError(f"{p}: {e}") from None


def load_editor(path: str | os.PathLike[str] | None = None) -> EditorModel:
    """The editor `--method model` uses: `path`, else the shipped weights, else (with a warning
    from the caller) seeded untrained weights.  `model.trained` says which."""
    if path is not None:
        return load_weights(path)
    if DEFAULT_WEIGHTS.exists():
        return load_weights(DEFAULT_WEIGHTS)
    model = EditorModel.initial()
    model.trained = False
    return model
