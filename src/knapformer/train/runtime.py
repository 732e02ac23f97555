"""Process group and device: which backend to start, and which device the trainer then uses.

The device follows the process group's backends, not one backend's name: the mixed
``"cpu:gloo,cuda:nccl"`` group (CPU agreement tensors on gloo, device tensors on NCCL: no host
sync for small checks) is a CUDA group as much as plain ``"nccl"`` is.
"""

from __future__ import annotations

import datetime
import os

import torch
import torch.distributed as dist

__all__ = ["CUDA_BACKEND", "default_backend", "device_type_for", "init_distributed", "run_device"]

#: What the trainer and the launcher start on a CUDA machine.
CUDA_BACKEND = "cpu:gloo,cuda:nccl"


def default_backend(cuda_available: bool) -> str:
    """``"cpu:gloo,cuda:nccl"`` with CUDA, else ``"gloo"``."""
    return CUDA_BACKEND if cuda_available else "gloo"


def device_type_for(backend: str, cuda_available: bool) -> str:
    """``"cuda"`` when CUDA is available and ``backend`` (as ``dist.get_backend()`` spells
    it: ``"nccl"``, ``"gloo"``, ``"cpu:gloo,cuda:nccl"``, ...) has a backend for CUDA
    tensors; else ``"cpu"``."""
    if not cuda_available:
        return "cpu"
    for part in backend.lower().replace(" ", "").split(","):
        device, sep, name = part.rpartition(":")
        if sep and device == "cuda":
            return "cuda"
        if not sep and name == "nccl":  # an unqualified backend name: nccl is CUDA-only
            return "cuda"
    return "cpu"


def run_device() -> torch.device:
    """The device of this rank on the initialised process group."""
    kind = device_type_for(str(dist.get_backend()), torch.cuda.is_available())
    if kind == "cuda":  # pragma: no cover - CUDA only
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def init_distributed(timeout_s: float) -> None:
    """From torchrun's environment (``env://``): the default backend of this machine."""
    if dist.is_initialized():
        return
    cuda = torch.cuda.is_available()
    if cuda:  # pragma: no cover - CUDA only
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group(default_backend(cuda), timeout=datetime.timedelta(seconds=timeout_s))
