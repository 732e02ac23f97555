"""Checkpoints with ``torch.distributed.checkpoint`` (DCP): model, optimiser, trainer state.

Layout: ``DIR/step_00000012/`` holds the DCP shards of the (FSDP2-sharded) model, optimiser and
EMA (when the run keeps one, sharded like the parameters) plus ``trainer.json`` (step, balancer
state, data position, config, the cost model in use, the online refit's state, whether there is
an EMA, and ``files``: the size and SHA-256 of every file the save wrote); ``DIR/latest`` names
the newest complete step directory.

Never lose a checkpoint: a save writes into a fresh ``DIR/.partial-step_…``, fsyncs it, renames
it into place and only then replaces ``latest`` (temp file, fsync, ``os.replace``). The
directory ``latest`` names is never written into, so a kill at any moment leaves the previous
checkpoint in charge; the next save clears the partial directory. A fresh run refuses a
directory that already holds checkpoints (:func:`check_fresh_dir`) unless told to overwrite.

Run no code from files: DCP pickles ``.metadata`` and its own reader unpickles it, and loads
non-tensor values with ``weights_only=False``. Here ``.metadata`` goes through an unpickler that
builds DCP's own types only (:func:`read_metadata`), every other value is loaded with
``weights_only=True``, and before any of that the files are checked against the sizes and hashes
``trainer.json`` recorded, so a truncated or flipped file is one line naming it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import io
import json
import os
import pickle
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from appshell.atomic import atomic_open
from appshell.errors import first_line
from appshell.inputs import InputFileError, load_json, read_text

if TYPE_CHECKING:
    from knapformer.train.config import TrainConfig
    from knapformer.train.ema import EMA

__all__ = [
    "CheckpointError",
    "check_fresh_dir",
    "check_resume",
    "latest_checkpoint",
    "load_checkpoint",
    "read_metadata",
    "read_trainer_state",
    "save_checkpoint",
    "verify_files",
]

PARTIAL = ".partial-"
_HASH_CHUNK = 1 << 22


class CheckpointError(ValueError):
    """No usable checkpoint where one was asked for, or a save that failed (one line)."""


def _step_dir(root: Path, step: int) -> Path:
    return root / f"step_{step:08d}"


def _latest_name(root: Path) -> str | None:
    marker = root / "latest"
    if not marker.is_file():
        return None
    try:
        return read_text(marker, max_bytes=4096, what="checkpoint marker").strip() or None
    except (OSError, InputFileError):
        return None


def check_fresh_dir(root: str | Path, overwrite: bool) -> None:
    """Refuse a fresh run into a directory that holds checkpoints unless ``overwrite``: its
    saves would replace them step by step, and the old run could no longer be resumed."""
    root = Path(root)
    if overwrite or not root.is_dir():
        return
    held = _latest_name(root) or next((p.name for p in sorted(root.glob("step_*"))), None)
    if held is not None:
        raise CheckpointError(
            f"{root} already holds checkpoints ({held}): continue them with --resume, or "
            "pass --overwrite to start a new run there"
        )


# ---- errors: one line, on every rank at once --------------------------------------------------


def _cause(exc: BaseException) -> BaseException:
    """The first rank's exception inside DCP's CheckpointException (which lists them all)."""
    failures = getattr(exc, "failures", None)
    if isinstance(exc, CheckpointException) and failures:
        first = next(iter(failures.values()))
        return _cause(first[0] if isinstance(first, tuple) else first)
    return exc


def _reason(exc: BaseException) -> str:
    exc = _cause(exc)
    if isinstance(exc, OSError):
        what = exc.strerror or first_line(exc)
        return f"{what} ({exc.filename})" if exc.filename else what
    return first_line(exc)


def _agree(error: str | None, clean: Path | None = None) -> None:
    """Collective: raise the first rank's error on every rank (or return when none has one),
    so no rank walks on into a collective the others have left. ``clean``: a partial save
    directory rank 0 removes first (its space may be what ran out)."""
    if dist.is_initialized() and dist.get_world_size() > 1:
        errors: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(errors, error)
        error = next((e for e in errors if e), None)
    if error:
        if clean is not None and (not dist.is_initialized() or dist.get_rank() == 0):
            shutil.rmtree(clean, ignore_errors=True)
        raise CheckpointError(error)


def _fsync_dir(path: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


# ---- save -------------------------------------------------------------------------------------


def _write_shards(state: dict[str, Any], path: Path) -> None:
    """DCP's collective write of ``state`` into ``path`` (files fsynced). One function, so a
    test can make it fail part way."""
    dcp.save(state, storage_writer=FileSystemWriter(str(path), sync_files=True))


def _hash_file(path: Path) -> dict[str, Any]:
    h = hashlib.sha256()
    size = 0
    with open(path, "rb") as f:
        while chunk := f.read(_HASH_CHUNK):
            h.update(chunk)
            size += len(chunk)
    return {"size": size, "sha256": h.hexdigest()}


def _share(names: list[str]) -> list[str]:
    """This rank's share of ``names`` (each file is hashed by one rank)."""
    if not dist.is_initialized():
        return names
    return names[dist.get_rank() :: dist.get_world_size()]


def save_checkpoint(
    root: str | Path,
    step: int,
    model: nn.Module,
    optim: Any,
    extra: dict[str, Any],
    ema: EMA | None = None,
) -> Path:
    """Collective: every rank writes its shards into a fresh partial directory; rank 0 writes
    the trainer state, renames the directory into place and moves ``latest`` last. A failure
    (a full disk, ...) is one :class:`CheckpointError` on every rank, naming the directory;
    the previous checkpoint stays in charge."""
    root = Path(root)
    rank = dist.get_rank()
    final = _step_dir(root, step)
    tmp = root / f"{PARTIAL}{final.name}"
    error = None
    if rank == 0:
        try:
            root.mkdir(parents=True, exist_ok=True)
            for old in root.glob(f"{PARTIAL}*"):  # left by a save that was killed
                shutil.rmtree(old)
            tmp.mkdir()
        except OSError as exc:
            error = f"cannot write checkpoint {final}: {_reason(exc)}"
    _agree(error)
    msd, osd = get_state_dict(model, optim)
    state: dict[str, Any] = {"model": msd, "optim": osd}
    if ema is not None:
        state["ema"] = ema.state_dict()
    error = None
    files: dict[str, Any] = {}
    try:
        _write_shards(state, tmp)
    except (OSError, CheckpointException) as exc:
        error = f"cannot write checkpoint {final}: {_reason(exc)}"
    _agree(error, clean=tmp)
    try:
        names = sorted(p.name for p in tmp.iterdir() if p.is_file())
        files = {n: _hash_file(tmp / n) for n in _share(names)}
    except OSError as exc:
        error = f"cannot read back checkpoint {final}: {_reason(exc)}"
    _agree(error, clean=tmp)
    shares: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(shares, files)
    if rank == 0:
        files = {k: v for share in shares for k, v in share.items()}
        try:
            final = _publish(root, tmp, final, {"step": step, **extra, "files": files})
        except OSError as exc:
            error = f"cannot write checkpoint {final}: {_reason(exc)}"
    _agree(error, clean=tmp)
    return final


def _publish(root: Path, tmp: Path, final: Path, trainer: dict[str, Any]) -> Path:
    """Rank 0: trainer state into ``tmp``, ``tmp`` renamed to ``final``, then ``latest``."""
    with atomic_open(tmp / "trainer.json", "w") as f:
        json.dump(trainer, f, indent=2, sort_keys=True)
    _fsync_dir(tmp)
    if final.exists():
        if final.name == _latest_name(root):  # in charge (a run with --overwrite): keep it
            k = 1
            while final.with_name(f"{final.name}-{k}").exists():
                k += 1
            final = final.with_name(f"{final.name}-{k}")
        else:  # not in charge: left by a run this one replaces
            shutil.rmtree(final)
    os.replace(tmp, final)
    _fsync_dir(root)
    with atomic_open(root / "latest", "w") as f:  # last: the new checkpoint takes charge
        f.write(final.name + "\n")
    return final


# ---- load -------------------------------------------------------------------------------------


def latest_checkpoint(root: str | Path) -> Path:
    root = Path(root)
    marker = root / "latest"
    if not marker.exists():
        raise CheckpointError(f"--resume: no checkpoint in {str(root)!r} (no 'latest' file)")
    try:
        name = read_text(marker, max_bytes=4096, what="checkpoint marker").strip()
    except (OSError, InputFileError) as exc:
        raise CheckpointError(f"--resume: {marker}: {_reason(exc)}") from None
    if not name or "/" in name or name in (".", ".."):
        raise CheckpointError(f"--resume: {marker} does not name a step directory: {name!r}")
    path = root / name
    if not (path / "trainer.json").exists():
        raise CheckpointError(f"--resume: checkpoint {str(path)!r} is incomplete")
    return path


def read_trainer_state(root: str | Path) -> dict[str, Any]:
    """The latest checkpoint's trainer state (step, balancer, data position, config, cost
    model), without touching the model: the trainer needs the cost model before building it."""
    path = latest_checkpoint(root)
    try:
        extra = load_json(path / "trainer.json", what="trainer state")
    except InputFileError as exc:
        raise CheckpointError(f"--resume: {exc}") from None
    if not isinstance(extra, dict) or not isinstance(extra.get("step"), int):
        raise CheckpointError(f"--resume: trainer state in {str(path)!r} is not a JSON object")
    return extra


def check_resume(cfg: TrainConfig, extra: dict[str, Any]) -> None:
    """Refuse to resume with a config that differs from the checkpoint's outside
    :data:`~knapformer.train.config.RESUMABLE_KEYS`, naming every differing key at once."""
    from knapformer.train.config import RESUMABLE_KEYS, ConfigError, build_config, config_changes

    where = Path(cfg.checkpoint.dir) / "latest"
    if not isinstance(extra.get("config"), dict):
        raise CheckpointError(f"--resume: the checkpoint ({where}) records no config")
    try:
        saved = build_config(extra["config"])
    except ConfigError as exc:
        raise CheckpointError(f"--resume: the checkpoint's config is not usable: {exc}") from None
    changed = config_changes(saved, cfg)
    if changed:
        raise CheckpointError(
            f"--resume: the config differs from the checkpoint's in {'; '.join(changed)}; "
            f"only {', '.join(RESUMABLE_KEYS)} may change on resume (start a new run with "
            "--overwrite instead)"
        )


def verify_files(path: str | Path, extra: dict[str, Any], *, share: bool = False) -> None:
    """Check the files of checkpoint ``path`` against the sizes and SHA-256 hashes its save
    recorded (a checkpoint written before they were recorded passes unchecked). ``share``:
    collective, each rank checks a share of the files and all raise the first error."""
    path = Path(path)
    files = extra.get("files")
    error = None
    try:
        if files is not None:
            if not isinstance(files, dict):
                raise CheckpointError(f"--resume: {path / 'trainer.json'}: 'files' is not a table")
            names = sorted(files)
            for name in _share(names) if share else names:
                _verify_one(path, name, files[name])
    except CheckpointError as exc:
        error = str(exc)
    if share:
        _agree(error)
    elif error:
        raise CheckpointError(error)


def _verify_one(path: Path, name: str, want: Any) -> None:
    f = path / name
    if "/" in name or name in (".", "..") or not isinstance(want, dict):
        raise CheckpointError(f"--resume: {path / 'trainer.json'} lists a bad file {name!r}")
    if not f.is_file():
        raise CheckpointError(f"--resume: {f}: missing (the save wrote it)")
    try:
        got = _hash_file(f)
    except OSError as exc:
        raise CheckpointError(f"--resume: {f}: {_reason(exc)}") from None
    if got["size"] != want.get("size"):
        raise CheckpointError(
            f"--resume: {f}: {got['size']} bytes, the save wrote {want.get('size')} "
            "(truncated or damaged)"
        )
    if got["sha256"] != want.get("sha256"):
        raise CheckpointError(
            f"--resume: {f}: contents differ from what the save wrote (SHA-256 mismatch: damaged)"
        )


#: What DCP's ``.metadata`` pickle holds (torch 2.4-2.13): its metadata dataclasses, torch
#: sizes, dtypes and layouts, and the checkpoint id's path. Nothing else is built.
_METADATA_TYPES = {
    ("torch.distributed.checkpoint.metadata", name)
    for name in (
        "Metadata",
        "TensorStorageMetadata",
        "ChunkStorageMetadata",
        "BytesStorageMetadata",
        "TensorProperties",
        "MetadataIndex",
        "StorageMeta",
        "_MEM_FORMAT_ENCODING",
    )
} | {
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("torch.distributed.checkpoint.filesystem", "_StoragePrefix"),
    ("torch", "Size"),
    ("torch.serialization", "_get_layout"),
    ("pathlib", "PosixPath"),
    ("pathlib", "PurePosixPath"),
    ("collections", "OrderedDict"),
}


class _MetadataUnpickler(pickle.Unpickler):
    """Builds DCP's metadata types and nothing else: a crafted ``.metadata`` can name any
    callable, and a plain unpickler would call it."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _METADATA_TYPES:
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        raise pickle.UnpicklingError(f"refused to load {module}.{name} (not a DCP metadata type)")


def read_metadata(path: str | Path) -> Any:
    """DCP's ``Metadata`` of checkpoint ``path``, through the restricted unpickler."""
    from torch.distributed.checkpoint.metadata import Metadata

    f = Path(path) / ".metadata"
    try:
        with open(f, "rb") as fh:
            md = _MetadataUnpickler(fh).load()
    except OSError as exc:
        raise CheckpointError(f"--resume: {f}: {_reason(exc)}") from None
    except Exception as exc:  # any unpickling failure is a damaged or crafted file
        raise CheckpointError(f"--resume: {f}: not DCP metadata: {first_line(exc)}") from None
    if not isinstance(md, Metadata):
        raise CheckpointError(f"--resume: {f}: not DCP metadata (a {type(md).__name__})")
    return md


class _SafeReader(FileSystemReader):
    """DCP's file reader with the restricted metadata unpickler and a one-line error naming
    the shard file a read failed in."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> Any:
        from torch.distributed.checkpoint.metadata import StorageMeta

        md = read_metadata(self.path)
        if getattr(md, "storage_meta", None) is None:
            md.storage_meta = StorageMeta()
        md.storage_meta.load_id = self.load_id
        return md

    def read_data(self, plan: Any, planner: Any) -> Any:
        per_file: dict[str, list[Any]] = {}
        for item in plan.items:
            per_file.setdefault(self.storage_data[item.storage_index].relative_path, []).append(
                item
            )
        fut = None
        for name, items in per_file.items():
            try:
                fut = super().read_data(dataclasses.replace(plan, items=items), planner)
            except Exception as exc:
                raise CheckpointError(
                    f"--resume: {Path(self.path) / name}: cannot be read: {_reason(exc)}"
                ) from None
        return fut if fut is not None else super().read_data(plan, planner)


class _SafeLoadPlanner(DefaultLoadPlanner):
    """Non-tensor values (optimiser hyper-parameters, ...) with ``weights_only=True``: DCP's
    default unpickles them with arbitrary code."""

    def load_bytes(self, read_item: Any, value: io.BytesIO) -> None:
        obj = torch.load(value, weights_only=True)
        if self.flatten_state_dict:
            from torch.distributed.checkpoint._traverse import set_element

            set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], obj)
        else:
            self.state_dict[read_item.dest_index.fqn] = obj


def load_checkpoint(
    root: str | Path, model: nn.Module, optim: Any, ema: EMA | None = None
) -> dict[str, Any]:
    """Collective: restore model, optimiser and (if the checkpoint has one) the EMA in place;
    returns the trainer state. A checkpoint without an EMA leaves ``ema`` as it is. Files are
    checked against their recorded hashes and the metadata read safely before DCP reads
    anything; every failure is one :class:`CheckpointError` on every rank."""
    path = latest_checkpoint(root)
    extra = read_trainer_state(root)
    verify_files(path, extra, share=True)
    error = None
    try:
        read_metadata(path)
    except CheckpointError as exc:
        error = str(exc)
    _agree(error)
    msd, osd = get_state_dict(model, optim)
    state: dict[str, Any] = {"model": msd, "optim": osd}
    if ema is not None and extra.get("ema"):
        state["ema"] = ema.state_dict()  # DCP loads into these tensors in place
    try:
        dcp.load(state, storage_reader=_SafeReader(str(path)), planner=_SafeLoadPlanner())
    except (CheckpointException, CheckpointError, OSError, RuntimeError, ValueError) as exc:
        cause = _cause(exc)
        msg = str(cause) if isinstance(cause, CheckpointError) else None
        raise CheckpointError(msg or f"--resume: cannot read {path}: {_reason(exc)}") from None
    set_state_dict(model, optim, model_state_dict=state["model"], optim_state_dict=state["optim"])
    if ema is not None and not extra.get("ema"):
        ema.reset(model)  # start from the restored weights
    return extra
