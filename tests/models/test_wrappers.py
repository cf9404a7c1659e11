"""TransparentWrapper, the base of the generic wrappers: the wrapped module's state-dict keys, its forward, and
train()/eval() returning the wrapper around a module whose own train() returns None (mmdet's Swin)."""
import pytest
import torch
from mmdet.models.backbones import SwinTransformer

import condtok_mm  # noqa: F401
from condtok_mm.models.wrappers import TransparentWrapper
from condtok_mm.registry import MODELS

SWIN = dict(type='mmdet.SwinTransformer', embed_dims=8, depths=(1, 1), num_heads=(1, 2), strides=(4, 2),
            out_indices=(0, 1), window_size=4)


@pytest.mark.parametrize('wrapper', ['CondTokBackbone', 'SpectralAttentionBackbone'])
def test_train_and_eval_return_the_wrapper_and_reach_the_wrapped_backbone(wrapper):
    model = MODELS.build(dict(type=wrapper, backbone=SWIN))
    assert SwinTransformer.train(model.wrapped, False) is None  # what nn.Module.eval() would hand back
    assert model.eval() is model and not model.wrapped.training
    assert model.train() is model and model.wrapped.training


def test_state_dict_and_forward_are_the_wrapped_modules():
    class Wrapper(TransparentWrapper):
        def __init__(self):
            super().__init__()
            self.wrapped = torch.nn.Linear(3, 2)

    wrapper, plain = Wrapper(), torch.nn.Linear(3, 2)
    assert list(wrapper.state_dict()) == list(plain.state_dict()) == ['weight', 'bias']
    wrapper.load_state_dict(plain.state_dict(), strict=True)
    x = torch.randn(4, 3)
    assert torch.equal(wrapper(x), plain(x))
    plain.load_state_dict(Wrapper().state_dict(), strict=True)  # and the wrapper's checkpoint loads unwrapped
