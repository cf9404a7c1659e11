import pytest
import torch

import condtok_mm  # noqa: F401
from condtok_mm.conditioning import condition_number
from condtok_mm.registry import MODELS
from mmdet.registry import MODELS as MMDET_MODELS


def test_builds_by_bare_name_from_mmdet_registry_with_defaults():
    conditioner = MMDET_MODELS.build(dict(type='TokenConditioner'))
    assert (conditioner.mode, conditioner.alpha, conditioner.target_kappa, conditioner.detach,
            conditioner.method) == ('sigma_max', 1.0, 2.0, True, 'gram')
    assert list(conditioner.parameters()) == [] and list(conditioner.buffers()) == []
    assert conditioner.state_dict() == {}


@pytest.mark.parametrize('mode', ['sigma_max', 'floor'])
def test_forward_conditions_each_image(mode):
    conditioner = MODELS.build(dict(type='TokenConditioner', mode=mode))
    tokens = torch.nn.functional.layer_norm(torch.randn(3, 400, 24), (24, ))
    out = conditioner(tokens)
    assert out.shape == tokens.shape
    assert (condition_number(out) <= 2 + 1e-3).all()
    # each image is conditioned on its own: the result for one image does not depend on the others
    torch.testing.assert_close(conditioner(tokens[1:2]), out[1:2])


@pytest.mark.parametrize('cfg, message', [
    (dict(mode='max'), "mode='max' is not supported; valid modes are sigma_max, floor"),
    (dict(method='qr'), "method='qr' is not supported; valid methods are gram, svd"),
    (dict(alpha=-0.5), 'alpha=-0.5 is invalid; use a number >= 0'),
    (dict(alpha='1'), "alpha='1' is invalid"),
    (dict(target_kappa=1), 'target_kappa=1 is invalid; use a number > 1'),
    (dict(detach='yes'), "detach='yes' is invalid; use True or False"),
])
def test_invalid_config_fails_at_build_time(cfg, message):
    with pytest.raises(ValueError, match=message.replace('(', r'\(').replace(')', r'\)')):
        MODELS.build(dict(type='TokenConditioner', **cfg))


def test_error_names_its_location():
    conditioner = MODELS.build(dict(type='TokenConditioner'))
    conditioner.location = 'CondSwinTransformer stage 2'
    with pytest.raises(ValueError, match='CondSwinTransformer stage 2'):
        conditioner(torch.full((1, 4, 4), float('nan')))
