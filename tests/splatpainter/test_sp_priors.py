"""The structural priors on Stage II's choice between hypotheses (Stage2Config.seen_prior_px,
map_prior) act exactly as stated: a multiplicative factor on the softmax weights of the
weights' own choice, whatever those weights are."""

import math

import pytest
import torch

from splatpainter.assets.procedural import make_demo_asset
from splatpainter.model import EditorConfig, EditorModel, GaussianSignals, Stage1Config
from splatpainter.model.stage2 import VIEW_CHANNELS, EditSample, Stage2Config


def _model(**s2) -> EditorModel:
    cfg = EditorConfig(
        stage1=Stage1Config(grid_size=8, dim=32, latent_dim=64, num_layers=1, num_views=2,
                            view_size=32),
        stage2=Stage2Config(dim=64, num_blocks=1, head_hidden=32, **s2),
    )  # fmt: skip
    model = EditorModel.initial(cfg, seed=3).eval()
    torch.manual_seed(11)  # a head with strong opinions, so the priors have work to do
    for p in model.stage2.head.parameters():
        torch.nn.init.normal_(p, std=0.4)
    return model


def _mix(model, asset, signals):
    view = torch.rand(16, 16, VIEW_CHANNELS, generator=torch.Generator().manual_seed(3))
    view[..., -1] = 1.0
    colors = 0.5 + 0.28209479 * asset.sh[:, 0]
    sample = EditSample(model.encode_asset(asset), [view], signals, colors, "auto")
    with torch.no_grad():
        out, _ = model.stage2([sample], model.stage2.init_state(1))
        stats = model.stage2._gaussian_inputs(sample)[1]
    return out[0]["mix"].double(), stats.double()


def _signals(n: int) -> GaussianSignals:
    g = torch.Generator().manual_seed(4)
    in_mask = torch.rand(n, generator=g) * 2.0
    in_mask[: n // 3] = 0.0  # a third no masked pixel shows
    return GaussianSignals(
        torch.randn(n, 3, generator=g) * 0.1, torch.full((n,), 0.2), torch.ones(n), in_mask
    )


@pytest.mark.parametrize("seen_px,map_prior", [(0.5, 0.0), (0.0, 0.03), (0.5, 0.03)])
def test_priors_reweight_the_learned_choice_exactly(seen_px, map_prior):
    asset = make_demo_asset(400).asset
    sig = _signals(asset.num_gaussians)
    plain, stats = _mix(_model(), asset, sig)
    mixed, _ = _mix(_model(seen_prior_px=seen_px, map_prior=map_prior), asset, sig)
    factor = torch.ones_like(plain)
    if seen_px:
        seen = 1.0 - torch.exp(-sig.in_mask_weight.double() / seen_px)
        factor[:, 0] = seen.clamp_min(1e-4)
    if map_prior:
        err = stats[1:3] ** 2
        factor[:, 1:] = torch.exp(-(err - err.min()) / map_prior**2)
    want = plain * factor
    want = want / want.sum(-1, keepdim=True)
    assert torch.allclose(mixed, want, atol=1e-5)
    if seen_px:  # an unseen Gaussian all but loses the seen change (zero for it)
        unseen = sig.in_mask_weight == 0
        odds = mixed[unseen, 0] / mixed[unseen, 1:].sum(-1)
        want_odds = 1e-4 * plain[unseen, 0] / (plain[unseen, 1:] * factor[unseen, 1:]).sum(-1)
        assert torch.allclose(odds, want_odds, rtol=1e-4)


def test_priors_are_off_by_default_and_refuse_nonsense():
    cfg = Stage2Config()
    assert cfg.seen_prior_px == 0.0 and cfg.map_prior == 0.0  # weights trained before them
    for bad in (-1.0, math.nan):
        with pytest.raises(ValueError, match="seen_prior_px"):
            Stage2Config(seen_prior_px=bad)
        with pytest.raises(ValueError, match="map_prior"):
            Stage2Config(map_prior=bad)
