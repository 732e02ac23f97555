"""The trainer's gradient scale, pinned to a single-process truth.

Two gloo ranks each run :func:`knapformer.train.step.train_step` on their own batch of the tiny
float64 config; the reference is one plain (unsharded) model in one process on both ranks'
batches together. The step's logged loss must be the global mean squared error (sum over every
visual token and channel of both ranks / their total count), and the gradients the optimiser
sees must be d(that mean)/d(weights), to 1e-10. AdamW would hide a wrong gradient scale (its
update is scale-free), so the optimiser here is plain SGD that records the gradients it is
handed. Both an unbalanced (FSDP only) and a balanced (Ulysses ``g2n1``) layout are checked.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _dist_utils import run_workers

RAW = {
    "model": {"preset": "tiny"},
    # the two ranks hold different numbers of visual tokens (2 images vs one 17-frame video)
    "data": {"codes": "g1b2i64f1s0,g1b1i64f17s1", "text_tokens_max": 4},
    "train": {"steps": 1, "lr": 1e-3, "dtype": "float64"},
    "balance": {"balancer": "none"},
    "log": {"progress": False},
}
LR = 0.5
LAYOUTS = ("none", "g2n1")


def _model(mcfg):
    """The tiny MMDiT with every weight random (adaLN-Zero would leave most gradients 0)."""
    from knapformer.models.mmdit import MMDiT

    torch.manual_seed(0)
    model = MMDiT(mcfg).double()
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(0.1 * torch.randn(p.shape, generator=gen, dtype=torch.float64))
    return model


class RecordingSGD(torch.optim.SGD):
    """Plain SGD that keeps (a full copy of) the gradients it is asked to apply."""

    def step(self, closure=None):
        self.seen = [
            (p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad).detach().clone()
            for g in self.param_groups
            for p in g["params"]
        ]
        return super().step(closure)


def grad_worker(rank: int, world: int, raw: dict, layouts: tuple[str, ...]):
    from torch.distributed.device_mesh import init_device_mesh

    from knapformer.calibration.clock import CPUClock
    from knapformer.distributed import Balancer
    from knapformer.distributed.parallelize import parallelize
    from knapformer.planning.cost import CostModel
    from knapformer.train.config import build_config
    from knapformer.train.step import mixture, train_step

    cfg = build_config(raw)
    mcfg = cfg.model_config()
    data = mixture(cfg, mcfg, world)
    tb = data.batch(1, rank, dtype=torch.float64)
    names = [n for n, _ in _model(mcfg).named_parameters()]
    mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("dp",))
    cost = CostModel(a=1.0, b=1e-3, name="test")
    out = {}
    for spec in layouts:
        model = _model(mcfg)
        bal = None
        if spec != "none":
            bal = Balancer(spec, cost, num_heads=mcfg.num_heads, group=mesh)
        parallelize(model, mesh, bal)
        optim = RecordingSGD(model.parameters(), lr=LR)
        rec = train_step(model, bal, optim, tb, 1, cost, CPUClock(), torch.device("cpu"), lr=LR)
        after = [
            (p.full_tensor() if hasattr(p, "full_tensor") else p).detach().numpy().copy()
            for p in model.parameters()
        ]
        out[spec] = {
            "loss": rec["loss"],
            "layout": rec["layout"],
            "grads": [g.numpy() for g in optim.seen],
            "after": after,
        }
    return {"names": names, "runs": out}


def _reference(world: int):
    """Loss, gradients and SGD-stepped weights of the plain model on every rank's batch."""
    from knapformer.train.config import build_config
    from knapformer.train.step import mixture

    cfg = build_config(RAW)
    mcfg = cfg.model_config()
    data = mixture(cfg, mcfg, world)
    model = _model(mcfg)
    before = [p.detach().clone() for p in model.parameters()]
    sq, n = torch.zeros((), dtype=torch.float64), 0
    for r in range(world):
        tb = data.batch(1, r, dtype=torch.float64)
        sq = sq + (model(tb.batch) - tb.target).pow(2).sum()
        n += tb.target.numel()
    loss = sq / n  # the global mean over every visual token and channel
    loss.backward()
    grads = [p.grad.detach().numpy() for p in model.parameters()]
    after = [(w - LR * p.grad).numpy() for w, p in zip(before, model.parameters(), strict=True)]
    return float(loss.detach()), grads, after


@pytest.mark.distributed
@pytest.mark.timeout(150)
def test_two_rank_step_gradients_equal_single_process_mean_loss_gradients(tmp_path):
    """Two gloo ranks' train_step == one process on the concatenated batch: the logged loss is
    the global mean, the gradients handed to the optimiser are d(global mean)/dw (so neither a
    1/n_vis scale nor a rank-local token count can pass), and one SGD step lands on the same
    weights; float64, to 1e-10."""
    res = run_workers(__file__, "grad_worker", 2, tmp_path, args=(RAW, LAYOUTS), timeout=140)
    ref_loss, ref_grads, ref_after = _reference(2)
    names = res[0]["names"]
    assert sum(float(np.abs(g).max()) > 1e-6 for g in ref_grads) > len(ref_grads) // 2
    for spec in LAYOUTS:
        for rank, r in enumerate(res):
            run = r["runs"][spec]
            assert run["layout"] == spec
            assert run["loss"] == pytest.approx(ref_loss, rel=1e-10, abs=1e-12), (spec, rank)
            for name, got, want in zip(names, run["grads"], ref_grads, strict=True):
                err = float(np.abs(got - want).max())
                assert err <= 1e-10, f"{spec} rank {rank}: d loss / d {name} off by {err:.3g}"
            for name, got, want in zip(names, run["after"], ref_after, strict=True):
                err = float(np.abs(got - want).max())
                assert err <= 1e-10, f"{spec} rank {rank}: {name} after SGD off by {err:.3g}"
