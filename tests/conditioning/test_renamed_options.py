"""Option names that were replaced are refused wherever they are given, naming the one to use: ``method`` (the
implementation is one option, ``solver``) and TokenConditioner's ``location`` (the name errors start with is the
option ``where``)."""
import re

import pytest
import torch

import condtok_mm  # noqa: F401
from condtok_mm.conditioning import (ConditioningOptions, condition_token_windows, condition_tokens,
                                     condition_valid_regions, token_correction, write_conditioned)
from condtok_mm.registry import MODELS

# (the old method, the solver its refusal names)
METHODS = [('batched', "'auto' (or 'eigh', 'newton_schulz')"), ('gram', "'reference_gram'"),
           ('svd', "'reference_svd'")]


def refusal(where, method, solver):
    return (f'^{re.escape(where)}: method={re.escape(repr(method))} is no longer an option; use '
            f'solver={re.escape(solver)}: one option, solver, says how the correction is computed')


@pytest.mark.parametrize('method, solver', METHODS)
def test_method_is_refused_naming_the_solver_wherever_it_is_given(method, solver):
    x = torch.randn(2, 12, 4)
    with pytest.raises(TypeError, match=refusal('condition_tokens', method, solver)):
        ConditioningOptions(method=method)
    with pytest.raises(TypeError, match=refusal('stage 0', method, solver)):
        ConditioningOptions(where='stage 0').replace(method=method)
    with pytest.raises(TypeError, match=refusal('condition_tokens', method, solver)):
        condition_tokens(x, method=method)
    with pytest.raises(TypeError, match=refusal('condition_valid_regions', method, solver)):
        condition_valid_regions(x.view(2, 3, 4, 4), [(3, 4), (2, 2)], method=method)
    with pytest.raises(TypeError, match=refusal('condition_token_windows', method, solver)):
        condition_token_windows(x, (3, 4), 2, method=method)
    with pytest.raises(TypeError, match=refusal('token_correction', method, solver)):
        token_correction(x.double(), method=method)
    with pytest.raises(TypeError, match=refusal('write_conditioned', method, solver)):
        write_conditioned(x.view(2, 3, 4, 4), torch.empty(2, 3, 4, 4), method=method)
    with pytest.raises(TypeError, match=refusal('TokenConditioner', method, solver)):
        MODELS.build(dict(type='TokenConditioner', method=method))


def test_a_conditioners_old_attributes_are_refused_naming_the_new_ones():
    conditioner = MODELS.build(dict(type='TokenConditioner'))
    conditioner.where = 'CondSwinTransformer stage 0'
    with pytest.raises(AttributeError, match=r'^CondSwinTransformer stage 0: method is no longer an option; use '
                                             r"solver=one of 'auto', 'eigh', 'newton_schulz', 'reference_gram', "
                                             r"'reference_svd'"):
        conditioner.method
    with pytest.raises(AttributeError, match=r'^CondSwinTransformer stage 0: method is no longer an option'):
        conditioner.method = 'gram'
    with pytest.raises(AttributeError, match=r'^CondSwinTransformer stage 0: location is no longer an attribute of '
                                             r'TokenConditioner; use where \(the name its errors start with'):
        conditioner.location
    with pytest.raises(AttributeError, match=r'^CondSwinTransformer stage 0: location is no longer an attribute'):
        conditioner.location = 'CondViT patch embedding'
    assert conditioner.where == 'CondSwinTransformer stage 0' and conditioner.solver == 'auto'


def test_where_names_every_error_of_a_conditioner_after_it_is_set():
    conditioner = MODELS.build(dict(type='TokenConditioner', scope='window', window_size=2))
    conditioner.where = 'CondViT patch embedding'
    assert conditioner.options.where == conditioner.placement.where == 'CondViT patch embedding'
    with pytest.raises(ValueError, match=r"^CondViT patch embedding: scope='window' needs the token grid"):
        conditioner(torch.randn(1, 4, 3))
    with pytest.raises(ValueError, match=r'^CondViT patch embedding: shift_size=2 is invalid'):
        conditioner.shift_size = 2
