"""Balanced MMDiT (parallelize: balancer + FSDP2 [+ activation checkpointing]) == one process.

Real gloo ranks (file:// rendezvous, forked by ``_dist_utils.run_workers``), float64. Every rank
holds a part of one global batch (one rank may hold nothing); the reference is the plain model on
the whole batch in one process. Outputs must match per token, and the FSDP-reduced gradients
(averaged over ranks, so times the world size) must match the reference gradients. The unbalanced
FSDP run (``"none"``) is held to the same standard, so balanced == unbalanced follows.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from knapformer.models.mmdit import MMDiT, Modulation, PackedBatch, mmdit_config

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _dist_utils import run_workers

# (text tokens, (t, h, w)) per sequence, per rank
SEQS_2 = [[(3, (1, 2, 3)), (0, (1, 1, 2))], [(5, (4, 3, 3)), (2, (1, 1, 1))]]
SEQS_4 = [
    [(2, (1, 2, 2))],
    [],  # a rank with an empty batch
    [(4, (5, 3, 4)), (1, (1, 1, 3)), (0, (1, 2, 1))],
    [(6, (2, 2, 2))],
]


def _cfg():
    return mmdit_config("tiny")


def _seq(n_txt: int, grid: tuple[int, int, int], seed: int):
    cfg = _cfg()
    g = torch.Generator().manual_seed(seed)
    t, h, w = grid
    n_img = t * h * w
    pos = torch.stack(
        torch.meshgrid(torch.arange(t), torch.arange(h), torch.arange(w), indexing="ij"), -1
    ).reshape(-1, 3)
    return {
        "img": torch.randn(n_img, cfg.patch_dim, generator=g, dtype=torch.float64),
        "txt": torch.randn(n_txt, cfg.text_dim, generator=g, dtype=torch.float64),
        "pos": torch.cat([torch.zeros(n_txt, 3, dtype=torch.int64), pos]),
        "is_img": torch.arange(n_txt + n_img) >= n_txt,
        "t": torch.rand((), generator=g, dtype=torch.float64),
        "pooled": torch.randn(cfg.pooled_dim, generator=g, dtype=torch.float64),
        "w": torch.randn(n_img, cfg.patch_dim, generator=g, dtype=torch.float64),
    }


def _pack(seqs: list[dict]) -> tuple[PackedBatch, torch.Tensor]:
    cfg = _cfg()
    if not seqs:
        f = torch.float64
        return PackedBatch(
            torch.zeros(0, cfg.patch_dim, dtype=f),
            torch.zeros(0, cfg.text_dim, dtype=f),
            torch.zeros(0, dtype=torch.bool),
            torch.zeros(0, 3, dtype=torch.int64),
            [],
            torch.zeros(0, dtype=f),
            torch.zeros(0, cfg.pooled_dim, dtype=f),
        ), torch.zeros(0, cfg.patch_dim, dtype=f)
    batch = PackedBatch(
        img=torch.cat([s["img"] for s in seqs]),
        txt=torch.cat([s["txt"] for s in seqs]),
        is_img=torch.cat([s["is_img"] for s in seqs]),
        positions=torch.cat([s["pos"] for s in seqs]),
        seq_lens=[int(s["is_img"].numel()) for s in seqs],
        timesteps=torch.stack([s["t"] for s in seqs]),
        pooled=torch.stack([s["pooled"] for s in seqs]),
    )
    return batch, torch.cat([s["w"] for s in seqs])


def _randomize_modulation(model: MMDiT) -> MMDiT:
    """Random (not adaLN-Zero) modulations: blocks that start as the identity would let
    per-sequence conditioning or routing mistakes through unseen."""
    for m in model.modules():
        if isinstance(m, Modulation):
            m.lin.reset_parameters()
    return model


def _model() -> MMDiT:
    torch.manual_seed(0)
    return _randomize_modulation(MMDiT(_cfg()).double())


def mmdit_worker(rank: int, world: int, seqs: list, cases: list[tuple[str, bool]]):
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from knapformer.distributed import Balancer
    from knapformer.distributed.parallelize import parallelize
    from knapformer.planning.cost import CostModel

    per_rank = [
        [_seq(n, g, seed=100 * r + i) for i, (n, g) in enumerate(s)] for r, s in enumerate(seqs)
    ]
    ref_model = _model()
    full, W = _pack([s for r in per_rank for s in r])
    ref = ref_model(full)
    (ref * W).sum().backward()
    ref_grads = [p.grad for p in ref_model.parameters()]
    n_img = [sum(int(s["is_img"].sum()) for s in r) for r in per_rank]
    off = sum(n_img[:rank])
    mine, Wm = _pack(per_rank[rank])
    mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("dp",))
    results = []
    for spec, ac in cases:
        model = _model()
        bal = None
        if spec != "none":
            # A DeviceMesh (or a mesh and a dimension) names the balance group.
            group = mesh["dp"] if world == 2 else (mesh, "dp")
            bal = Balancer(spec, CostModel.flops(32), num_heads=4, group=group)
        parallelize(model, mesh, bal, activation_checkpointing=ac)
        for _step in range(2):  # the second step reuses cached routing state
            model.zero_grad()
            if bal is not None:
                bal.plan_step(mine.seq_lens)
            out = model(mine)
            (out * Wm).sum().backward()
        out_err = (
            float((out.detach() - ref[off : off + n_img[rank]].detach()).abs().max())
            if n_img[rank]
            else 0.0
        )
        grad_err = 0.0
        for p, rg in zip(model.parameters(), ref_grads, strict=True):
            g = p.grad.full_tensor() * world  # FSDP averages over the mesh
            grad_err = max(grad_err, float((g - rg).abs().max() / rg.abs().max().clamp_min(1e-30)))
        layout = bal.layout_spec if bal is not None else "none"
        results.append({"spec": spec, "ac": ac, "out": out_err, "grad": grad_err, "layout": layout})
        dist.barrier()
    return results


def _check(per_rank: list[list[dict]]) -> None:
    for i in range(len(per_rank[0])):
        rows = [r[i] for r in per_rank]
        out = max(r["out"] for r in rows)
        grad = max(r["grad"] for r in rows)
        assert out < 1e-10 and grad < 1e-10, (rows[0]["spec"], rows[0]["ac"], out, grad)


@pytest.mark.distributed
@pytest.mark.timeout(150)
def test_balanced_mmdit_fsdp_w2(tmp_path):
    cases = [("none", False), ("g2n1", False), ("auto", True)]
    res = run_workers(__file__, "mmdit_worker", 2, tmp_path, args=(SEQS_2, cases), timeout=140)
    _check(res)
    assert res[0][1]["layout"] == "g2n1"


@pytest.mark.distributed
@pytest.mark.timeout(150)
def test_balanced_mmdit_fsdp_w4_empty_rank(tmp_path):
    cases = [("none", False), ("g4n1", True), ("g1n2+g2n1", False)]
    res = run_workers(__file__, "mmdit_worker", 4, tmp_path, args=(SEQS_4, cases), timeout=140)
    _check(res)
