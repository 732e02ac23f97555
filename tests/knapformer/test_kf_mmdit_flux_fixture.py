"""The tiny MMDiT against a committed output fixture made by an independent FLUX re-statement.

Why: every other MMDiT test compares the model with itself (packed vs per sequence, balanced vs
one process) or checks one block at a time. This pins the whole forward (embedders, timestep
embedding, both block types, RoPE over (t, h, w), QK RMSNorm, final layer) to numbers that our
model never produced.

The re-statement below is written from FLUX's published formulas (``flux/model.py``,
``flux/modules/layers.py``, ``flux/math.py`` of black-forest-labs/flux), one sequence at a time
in FLUX's own layout (text tokens first, interleaved-pair RoPE), from plain torch arithmetic. It
imports nothing from ``knapformer``; only :func:`test_model_reproduces_the_fixture` does.

The weights are not stored (they would be ~0.5 MB in float64): :func:`flux_params` draws them
from ``torch.Generator().manual_seed(0)`` under FLUX's parameter names, and the fixture keeps
one sum per tensor so that a changed generator is reported as such, not as a model bug.

Regenerate (only when the formulas here are deliberately changed; never from our model)::

    OMP_NUM_THREADS=1 .venv/bin/python tests/knapformer/test_kf_mmdit_flux_fixture.py --write
"""

from __future__ import annotations

import math
import re
import sys
from pathlib import Path

import numpy as np
import torch

FIXTURE = Path(__file__).parent / "data" / "mmdit_tiny_seed0.npz"
SEED = 0
TOL = {"rtol": 1e-10, "atol": 1e-10}

#: FLUX's hyper-parameters for the tiny model (the numbers of knapformer's "tiny" preset).
TINY = {
    "hidden_size": 32,
    "num_heads": 4,
    "mlp_ratio": 4.0,
    "in_channels": 8,  # patch_dim
    "context_in_dim": 12,  # text_dim
    "vec_in_dim": 8,  # pooled_dim
    "time_dim": 16,  # FLUX uses 256; the tiny model a smaller sinusoid
    "axes_dim": (2, 2, 4),
    "theta": 10000.0,
    "depth": 1,
    "depth_single_blocks": 1,
}

#: Per sequence: text tokens, (t, h, w) latent grid, offset of the grid's first position.
SEQUENCES = [(3, (1, 2, 3), (0, 0, 0)), (2, (3, 2, 2), (2, 1, 0)), (0, (2, 1, 3), (0, 4, 1))]


# ---- FLUX, re-stated (plain torch, float64, one unbatched sequence) ----------------------------


def _linear(p: dict[str, torch.Tensor], name: str, x: torch.Tensor) -> torch.Tensor:
    return x @ p[f"{name}.weight"].T + p[f"{name}.bias"]


def _silu(x: torch.Tensor) -> torch.Tensor:
    return x / (1 + torch.exp(-x))


def _gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    return 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))


def _layer_norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """LayerNorm without affine parameters (FLUX's norm1/norm2/pre_norm/norm_final)."""
    mu = x.mean(-1, keepdim=True)
    return (x - mu) / torch.sqrt(((x - mu) ** 2).mean(-1, keepdim=True) + eps)


def _rms_norm(x: torch.Tensor, scale: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """FLUX's QK RMSNorm: x / sqrt(mean(x^2) + eps) * scale, per head."""
    return x / torch.sqrt((x**2).mean(-1, keepdim=True) + eps) * scale


def _timestep_embedding(t: torch.Tensor, dim: int, max_period: float = 10000.0) -> torch.Tensor:
    """[cos | sin] of 1000 t times exp(-ln(max_period) j / half), j < half = dim // 2."""
    half = dim // 2
    freqs = torch.exp(-math.log(max_period) * torch.arange(half, dtype=torch.float64) / half)
    args = 1000.0 * t[:, None] * freqs[None]
    emb = torch.cat([torch.cos(args), torch.sin(args)], dim=-1)
    if dim % 2:
        emb = torch.cat([emb, torch.zeros_like(emb[:, :1])], dim=-1)
    return emb


def _rope_axis(pos: torch.Tensor, dim: int, theta: float) -> torch.Tensor:
    """[L] positions -> [L, dim / 2, 2, 2] rotation matrices, angle pos * theta^(-2j / dim)."""
    omega = 1.0 / theta ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    a = pos.to(torch.float64)[:, None] * omega[None]
    return torch.stack([a.cos(), -a.sin(), a.sin(), a.cos()], dim=-1).reshape(*a.shape, 2, 2)


def _embed_nd(ids: torch.Tensor, axes_dim: tuple[int, ...], theta: float) -> torch.Tensor:
    """EmbedND: axis i of the [L, 3] ids drives its own block of axes_dim[i] / 2 pair angles."""
    return torch.cat([_rope_axis(ids[:, i], d, theta) for i, d in enumerate(axes_dim)], dim=1)


def _apply_rope(x: torch.Tensor, pe: torch.Tensor) -> torch.Tensor:
    """x [H, L, D]: features (2j, 2j+1) form pair j, rotated by pe[l, j] (interleaved layout)."""
    pairs = x.reshape(*x.shape[:-1], -1, 2)  # [H, L, D/2, 2]
    out = pe[None, ..., 0] * pairs[..., 0:1] + pe[None, ..., 1] * pairs[..., 1:2]
    return out.reshape(x.shape)


def _attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pe: torch.Tensor) -> torch.Tensor:
    """[H, L, D] each -> [L, H * D]: RoPE on q and k, then softmax(q k^T / sqrt(D)) v."""
    q, k = _apply_rope(q, pe), _apply_rope(k, pe)
    w = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1]), dim=-1)
    return (w @ v).transpose(0, 1).reshape(q.shape[1], -1)


def _heads(qkv: torch.Tensor, num_heads: int) -> tuple[torch.Tensor, ...]:
    """Split into heads: ``L (K H D) -> K H L D`` with K = 3 (q, k, v)."""
    L, d3 = qkv.shape
    return tuple(qkv.reshape(L, 3, num_heads, d3 // (3 * num_heads)).permute(1, 2, 0, 3))


def _modulation(p: dict, name: str, vec: torch.Tensor, n: int) -> list[tuple[torch.Tensor, ...]]:
    """lin(silu(vec)) chunked into n (shift, scale, gate) triples."""
    c = _linear(p, name, _silu(vec)).chunk(3 * n, dim=-1)
    return [tuple(c[3 * i : 3 * i + 3]) for i in range(n)]


Tensor = torch.Tensor


def _qkv(p: dict, pre: str, x: Tensor, shift: Tensor, scale: Tensor, num_heads: int):
    """One stream's modulated qkv with QK RMSNorm: [H, L, D] each."""
    q, k, v = _heads(_linear(p, f"{pre}_attn.qkv", (1 + scale) * _layer_norm(x) + shift), num_heads)
    q = _rms_norm(q, p[f"{pre}_attn.norm.query_norm.scale"])
    k = _rms_norm(k, p[f"{pre}_attn.norm.key_norm.scale"])
    return q, k, v


def _double_block(
    p: dict, pre: str, img: Tensor, txt: Tensor, vec: Tensor, pe: Tensor, num_heads: int
) -> tuple[Tensor, Tensor]:
    (i_s1, i_c1, i_g1), (i_s2, i_c2, i_g2) = _modulation(p, f"{pre}.img_mod.lin", vec, 2)
    (t_s1, t_c1, t_g1), (t_s2, t_c2, t_g2) = _modulation(p, f"{pre}.txt_mod.lin", vec, 2)
    iq, ik, iv = _qkv(p, f"{pre}.img", img, i_s1, i_c1, num_heads)
    tq, tk, tv = _qkv(p, f"{pre}.txt", txt, t_s1, t_c1, num_heads)
    cat = [torch.cat(pair, dim=1) for pair in ((tq, iq), (tk, ik), (tv, iv))]  # text first
    attn = _attention(*cat, pe)
    t_attn, i_attn = attn[: txt.shape[0]], attn[txt.shape[0] :]

    def mlp(stream: str, x: torch.Tensor) -> torch.Tensor:
        h = _gelu_tanh(_linear(p, f"{pre}.{stream}_mlp.0", x))
        return _linear(p, f"{pre}.{stream}_mlp.2", h)

    img = img + i_g1 * _linear(p, f"{pre}.img_attn.proj", i_attn)
    img = img + i_g2 * mlp("img", (1 + i_c2) * _layer_norm(img) + i_s2)
    txt = txt + t_g1 * _linear(p, f"{pre}.txt_attn.proj", t_attn)
    txt = txt + t_g2 * mlp("txt", (1 + t_c2) * _layer_norm(txt) + t_s2)
    return img, txt


def _single_block(p: dict, pre: str, x: Tensor, vec: Tensor, pe: Tensor, num_heads: int):
    ((shift, scale, gate),) = _modulation(p, f"{pre}.modulation.lin", vec, 1)
    d = x.shape[1]
    fused = _linear(p, f"{pre}.linear1", (1 + scale) * _layer_norm(x) + shift)
    qkv, mlp = fused[:, : 3 * d], fused[:, 3 * d :]
    q, k, v = _heads(qkv, num_heads)
    q = _rms_norm(q, p[f"{pre}.norm.query_norm.scale"])
    k = _rms_norm(k, p[f"{pre}.norm.key_norm.scale"])
    out = _linear(p, f"{pre}.linear2", torch.cat([_attention(q, k, v, pe), _gelu_tanh(mlp)], -1))
    return x + gate * out


def flux_forward(
    p: dict,
    img: Tensor,
    img_ids: Tensor,
    txt: Tensor,
    txt_ids: Tensor,
    t: Tensor,
    y: Tensor,
    cfg: dict = TINY,
) -> Tensor:
    """FLUX's ``Flux.forward`` for one sequence (no guidance embedding): [L_img, in_channels]."""
    img = _linear(p, "img_in", img)
    temb = _timestep_embedding(t, cfg["time_dim"])
    vec = _linear(p, "time_in.out_layer", _silu(_linear(p, "time_in.in_layer", temb)))
    vec = vec + _linear(p, "vector_in.out_layer", _silu(_linear(p, "vector_in.in_layer", y)))
    txt = _linear(p, "txt_in", txt)
    pe = _embed_nd(torch.cat([txt_ids, img_ids]), cfg["axes_dim"], cfg["theta"])
    heads = cfg["num_heads"]
    for i in range(cfg["depth"]):
        img, txt = _double_block(p, f"double_blocks.{i}", img, txt, vec, pe, heads)
    x = torch.cat([txt, img])
    for i in range(cfg["depth_single_blocks"]):
        x = _single_block(p, f"single_blocks.{i}", x, vec, pe, heads)
    x = x[txt.shape[0] :]
    shift, scale = _linear(p, "final_layer.adaLN_modulation.1", _silu(vec)).chunk(2, dim=-1)
    return _linear(p, "final_layer.linear", (1 + scale) * _layer_norm(x) + shift)


def flux_shapes(cfg: dict = TINY) -> dict[str, tuple[int, ...]]:
    """FLUX's parameter names and shapes (qkv_bias=True, no guidance embedder)."""
    d, hid = cfg["hidden_size"], int(cfg["hidden_size"] * cfg["mlp_ratio"])
    hd = d // cfg["num_heads"]
    s: dict[str, tuple[int, ...]] = {}

    def lin(name: str, n_in: int, n_out: int) -> None:
        s[f"{name}.weight"], s[f"{name}.bias"] = (n_out, n_in), (n_out,)

    lin("img_in", cfg["in_channels"], d)
    lin("time_in.in_layer", cfg["time_dim"], d)
    lin("time_in.out_layer", d, d)
    lin("vector_in.in_layer", cfg["vec_in_dim"], d)
    lin("vector_in.out_layer", d, d)
    lin("txt_in", cfg["context_in_dim"], d)
    for i in range(cfg["depth"]):
        for st in ("img", "txt"):
            pre = f"double_blocks.{i}.{st}"
            lin(f"{pre}_mod.lin", d, 6 * d)
            lin(f"{pre}_attn.qkv", d, 3 * d)
            s[f"{pre}_attn.norm.query_norm.scale"] = s[f"{pre}_attn.norm.key_norm.scale"] = (hd,)
            lin(f"{pre}_attn.proj", d, d)
            lin(f"{pre}_mlp.0", d, hid)
            lin(f"{pre}_mlp.2", hid, d)
    for i in range(cfg["depth_single_blocks"]):
        pre = f"single_blocks.{i}"
        lin(f"{pre}.linear1", d, 3 * d + hid)
        lin(f"{pre}.linear2", d + hid, d)
        s[f"{pre}.norm.query_norm.scale"] = s[f"{pre}.norm.key_norm.scale"] = (hd,)
        lin(f"{pre}.modulation.lin", d, 3 * d)
    lin("final_layer.linear", d, cfg["in_channels"])
    lin("final_layer.adaLN_modulation.1", d, 2 * d)
    return s


def flux_params(seed: int = SEED, cfg: dict = TINY) -> dict[str, torch.Tensor]:
    """Float64 weights under FLUX's names, drawn in name order from one seeded generator:
    linear weights N(0, 1/fan_in), biases N(0, 0.1^2), RMSNorm scales 1 + N(0, 0.1^2), and
    non-zero modulations (adaLN-Zero would make every block the identity and test nothing)."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    for name, shape in flux_shapes(cfg).items():
        r = torch.randn(shape, generator=g, dtype=torch.float64)
        if name.endswith(".scale"):
            out[name] = 1 + 0.1 * r
        elif name.endswith(".bias"):
            out[name] = 0.1 * r
        else:
            out[name] = r / math.sqrt(shape[1])
    return out


def flux_inputs(seed: int = SEED, cfg: dict = TINY) -> dict[str, np.ndarray]:
    """FLUX-layout inputs of every sequence (text ids are (0, 0, 0), as FLUX gives them)."""
    g = torch.Generator().manual_seed(seed + 1000)
    arrays: dict[str, np.ndarray] = {}
    for s, (n_txt, (T, H, W), (t0, h0, w0)) in enumerate(SEQUENCES):
        grid = torch.meshgrid(torch.arange(T), torch.arange(H), torch.arange(W), indexing="ij")
        ids = torch.stack(grid, -1).reshape(-1, 3) + torch.tensor([t0, h0, w0])
        arrays[f"img{s}"] = torch.randn(T * H * W, cfg["in_channels"], generator=g).double()
        arrays[f"img_ids{s}"] = ids
        arrays[f"txt{s}"] = torch.randn(n_txt, cfg["context_in_dim"], generator=g).double()
        arrays[f"txt_ids{s}"] = torch.zeros(n_txt, 3, dtype=torch.int64)
    n = len(SEQUENCES)
    arrays["timesteps"] = torch.rand(n, generator=g, dtype=torch.float64)
    arrays["pooled"] = torch.randn(n, cfg["vec_in_dim"], generator=g, dtype=torch.float64)
    return {k: v.numpy() for k, v in arrays.items()}


def restated_outputs(params: dict, inputs: dict[str, np.ndarray], cfg: dict = TINY) -> list:
    """The re-statement's output [L_img, in_channels] of each sequence."""
    outs = []
    t = torch.from_numpy(inputs["timesteps"])
    pooled = torch.from_numpy(inputs["pooled"])
    for s in range(len(SEQUENCES)):
        x = {k: torch.from_numpy(inputs[f"{k}{s}"]) for k in ("img", "img_ids", "txt", "txt_ids")}
        outs.append(flux_forward(params, **x, t=t[s : s + 1], y=pooled[s : s + 1], cfg=cfg))
    return outs


def write_fixture(path: Path = FIXTURE) -> None:
    """Inputs, per-sequence outputs and per-tensor weight sums, from the re-statement only."""
    params, inputs = flux_params(), flux_inputs()
    outs = restated_outputs(params, inputs)
    names = sorted(params)
    np.savez_compressed(
        path,
        **inputs,
        **{f"out{s}": o.numpy() for s, o in enumerate(outs)},
        param_names=np.array(names),
        param_sums=np.array([float(params[n].sum()) for n in names]),
    )


# ---- the tests ---------------------------------------------------------------------------------


def _fixture() -> dict[str, np.ndarray]:
    with np.load(FIXTURE, allow_pickle=False) as f:
        return dict(f)


def test_fixture_weights_and_inputs_are_the_seeded_ones():
    """The generator still gives the weights and inputs the fixture was made from (otherwise
    the other tests would blame the model for a change of torch's random stream)."""
    fx, params, inputs = _fixture(), flux_params(), flux_inputs()
    assert list(fx["param_names"]) == sorted(params)
    sums = np.array([float(params[n].sum()) for n in sorted(params)])
    np.testing.assert_allclose(sums, fx["param_sums"], rtol=1e-12, atol=1e-12)
    for k, v in inputs.items():
        np.testing.assert_array_equal(v, fx[k], err_msg=k)


def test_restatement_reproduces_the_fixture():
    """The committed numbers are what the FLUX formulas above give (float64, ~1e-10)."""
    fx = _fixture()
    outs = restated_outputs(flux_params(), fx)
    for s, o in enumerate(outs):
        assert o.shape == (len(fx[f"img{s}"]), TINY["in_channels"])
        np.testing.assert_allclose(o.numpy(), fx[f"out{s}"], **TOL, err_msg=f"sequence {s}")
    # Outputs of order 1: a fixture of near-zeros would pass a model that drops a block.
    assert all(np.abs(fx[f"out{s}"]).max() > 0.1 for s in range(len(SEQUENCES)))


#: FLUX name -> knapformer name (first match wins).
_RENAMES = [
    (r"^double_blocks\.(\d+)\.(img|txt)_mod\.lin\.", r"double_blocks.\1.\2.mod.lin."),
    (r"^double_blocks\.(\d+)\.(img|txt)_attn\.qkv\.", r"double_blocks.\1.\2.qkv."),
    (r"^double_blocks\.(\d+)\.(img|txt)_attn\.proj\.", r"double_blocks.\1.\2.proj."),
    (r"^double_blocks\.(\d+)\.(img|txt)_mlp\.", r"double_blocks.\1.\2.mlp."),
    (r"^double_blocks\.(\d+)\.(img|txt)_attn\.norm\.query_norm\.scale$",
     r"double_blocks.\1.\2.qk_norm.q.weight"),
    (r"^double_blocks\.(\d+)\.(img|txt)_attn\.norm\.key_norm\.scale$",
     r"double_blocks.\1.\2.qk_norm.k.weight"),
    (r"^single_blocks\.(\d+)\.modulation\.lin\.", r"single_blocks.\1.mod.lin."),
    (r"^single_blocks\.(\d+)\.norm\.query_norm\.scale$", r"single_blocks.\1.qk_norm.q.weight"),
    (r"^single_blocks\.(\d+)\.norm\.key_norm\.scale$", r"single_blocks.\1.qk_norm.k.weight"),
    (r"^final_layer\.adaLN_modulation\.1\.", "final_layer.mod.lin."),
]  # fmt: skip


def to_knapformer_state_dict(params: dict[str, torch.Tensor], cfg: dict = TINY) -> dict:
    """FLUX's weights under knapformer's names.

    One change besides the names: FLUX rotates interleaved feature pairs (2j, 2j+1) of a head,
    knapformer rotate-half pairs (j, j + D/2), both by angle column j. Relabelling each head's
    q and k features by ``perm`` (the rows of the q and k projections, and the QK-norm scales)
    makes the two compute the same function: attention scores sum over all features, so a
    consistent relabelling of q and k leaves them unchanged, and v is not rotated.
    """
    d, heads = cfg["hidden_size"], cfg["num_heads"]
    hd = d // heads
    perm = torch.cat([torch.arange(0, hd, 2), torch.arange(1, hd, 2)])

    def permute_qk_rows(t: torch.Tensor) -> torch.Tensor:
        qk = t[: 2 * d].reshape(2, heads, hd, *t.shape[1:])[:, :, perm]
        return torch.cat([qk.reshape(2 * d, *t.shape[1:]), t[2 * d :]])

    out = {}
    for name, t in params.items():
        new = name
        for pat, rep in _RENAMES:
            new, n = re.subn(pat, rep, name)
            if n:
                break
        if re.search(r"(_attn\.qkv|single_blocks\.\d+\.linear1)\.", name):
            t = permute_qk_rows(t)
        elif name.endswith("_norm.scale"):
            t = t[perm]
        out[new] = t.clone()
    return out


def _packed_batch(inputs: dict[str, np.ndarray], PackedBatch: type):
    """The fixture's sequences packed for knapformer, text tokens interleaved among the visual
    ones (visual tokens keep their order, so the output rows are the fixture's)."""
    g = torch.Generator().manual_seed(7)
    img, txt, is_img, pos, lens = [], [], [], [], []
    for s in range(len(SEQUENCES)):
        n_img, n_txt = len(inputs[f"img{s}"]), len(inputs[f"txt{s}"])
        kind = torch.cat([torch.ones(n_img), torch.zeros(n_txt)]).bool()
        kind = kind[torch.randperm(n_img + n_txt, generator=g)]
        p = torch.empty(n_img + n_txt, 3, dtype=torch.int64)
        p[kind] = torch.from_numpy(inputs[f"img_ids{s}"])
        p[~kind] = torch.from_numpy(inputs[f"txt_ids{s}"])
        img.append(torch.from_numpy(inputs[f"img{s}"]))
        txt.append(torch.from_numpy(inputs[f"txt{s}"]))
        is_img.append(kind)
        pos.append(p)
        lens.append(n_img + n_txt)
    return PackedBatch(
        img=torch.cat(img),
        txt=torch.cat(txt),
        is_img=torch.cat(is_img),
        positions=torch.cat(pos),
        seq_lens=lens,
        timesteps=torch.from_numpy(inputs["timesteps"]),
        pooled=torch.from_numpy(inputs["pooled"]),
    )


def test_model_reproduces_the_fixture():
    """knapformer's MMDiT ("tiny" preset) with the fixture's weights, loaded by name (strict),
    gives the fixture's outputs to ~1e-10 in float64, on all sequences packed together."""
    from knapformer.models.mmdit import MMDiT, PackedBatch, mmdit_config  # only here

    cfg = mmdit_config("tiny")
    ours = {
        "hidden_size": cfg.d_model,
        "num_heads": cfg.num_heads,
        "mlp_ratio": cfg.mlp_ratio,
        "in_channels": cfg.patch_dim,
        "context_in_dim": cfg.text_dim,
        "vec_in_dim": cfg.pooled_dim,
        "time_dim": cfg.time_dim,
        "axes_dim": tuple(cfg.axes_dim),
        "theta": cfg.rope_theta,
        "depth": cfg.depth_double,
        "depth_single_blocks": cfg.depth_single,
    }
    assert ours == TINY, "the tiny preset changed: regenerate the fixture for its new shape"
    model = MMDiT(cfg).double()
    model.load_state_dict(to_knapformer_state_dict(flux_params()), strict=True)
    fx = _fixture()
    with torch.no_grad():
        got = model(_packed_batch(fx, PackedBatch))
    want = np.concatenate([fx[f"out{s}"] for s in range(len(SEQUENCES))])
    np.testing.assert_allclose(got.numpy(), want, **TOL)


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        sys.exit(f"usage: {sys.argv[0]} --write  (rewrites {FIXTURE})")
    write_fixture()
    print(f"wrote {FIXTURE} ({FIXTURE.stat().st_size:,} bytes)")
