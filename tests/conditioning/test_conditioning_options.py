"""ConditioningOptions is the one carrier of the options: made and checked once, in one wording, and taken alike
by the functional API and TokenConditioner (whose option attributes are the carrier's, checked again on set)."""
import dataclasses
import re

import pytest
import torch

import condtok_mm  # noqa: F401
from condtok_mm.conditioning import (ConditioningOptions, condition_token_windows, condition_tokens,
                                     condition_valid_regions)
from condtok_mm.registry import MODELS
from helpers.tokens import random_tokens

# (option, invalid value, what the message says is valid)
INVALID = [
    ('mode', 'max', "one of 'sigma_max', 'floor', 'graying', 'graying_dct'"),
    ('alpha', -0.5, r'a number in [0, 100] (1 reaches the bound, 0 disables the correction)'),
    ('alpha', 1e30, r'a number in [0, 100] (1 reaches the bound, 0 disables the correction)'),
    ('alpha', '1', r'a number in [0, 100] (1 reaches the bound, 0 disables the correction)'),
    ('alpha', True, r'a number in [0, 100] (1 reaches the bound, 0 disables the correction)'),
    ('alpha', torch.tensor(-3.0), r'a number in [0, 100] (1 reaches the bound, 0 disables the correction)'),
    ('alpha', torch.tensor(1e30), r'a number in [0, 100] (1 reaches the bound, 0 disables the correction)'),
    ('alpha', torch.tensor(float('nan')), r'a number in [0, 100] (1 reaches the bound, 0 disables the correction)'),
    ('target_kappa', 1, 'a finite number > 1 (the paper uses 2.0)'),
    ('target_kappa', float('inf'), 'a finite number > 1 (the paper uses 2.0)'),
    ('target_kappa', float('nan'), 'a finite number > 1 (the paper uses 2.0)'),
    ('detach', 'yes', 'True or False'),
    ('centred', 1, 'True or False'),
    ('epsilon', 0, "a number in (0, 1] (mode='graying': kappa -> kappa^epsilon; the authors' default is 0.95)"),
    ('epsilon', 1.5, "a number in (0, 1] (mode='graying': kappa -> kappa^epsilon; the authors' default is 0.95)"),
    ('epsilon', True, "a number in (0, 1] (mode='graying': kappa -> kappa^epsilon; the authors' default is 0.95)"),
    ('epsilon', '0.9', "a number in (0, 1] (mode='graying': kappa -> kappa^epsilon; the authors' default is 0.95)"),
    ('solver', 'qr', "one of 'auto', 'eigh', 'newton_schulz', 'reference_gram', 'reference_svd'"),
    ('check', 'later', "one of 'auto', True, False ('auto': at once on the CPU, deferred to the next call on CUDA)"),
    ('control', 'both', "None (the method) or one of 'scale_matched', 'norm_matched'"),
]
IDS = [f'{name}={value!r}' for name, value, _ in INVALID]


def message(where, name, value, valid):
    return f'^{re.escape(where)}: {name}={re.escape(repr(value))} is invalid; use {re.escape(valid)}$'


@pytest.mark.parametrize('name, value, valid', INVALID, ids=IDS)
def test_every_invalid_option_is_refused_in_one_wording_wherever_it_is_given(name, value, valid):
    x = torch.randn(2, 12, 4)
    with pytest.raises(ValueError, match=message('condition_tokens', name, value, valid)):
        ConditioningOptions(**{name: value})
    with pytest.raises(ValueError, match=message('condition_tokens', name, value, valid)):
        condition_tokens(x, **{name: value})
    with pytest.raises(ValueError, match=message('condition_valid_regions', name, value, valid)):
        condition_valid_regions(x.view(2, 3, 4, 4), [(3, 4), (2, 2)], **{name: value})
    with pytest.raises(ValueError, match=message('condition_token_windows', name, value, valid)):
        condition_token_windows(x, (3, 4), 2, **{name: value})
    with pytest.raises(ValueError, match=message('CondViT patch embedding', name, value, valid)):
        condition_tokens(x, options=ConditioningOptions(where='CondViT patch embedding'), **{name: value})
    with pytest.raises(ValueError, match=message('TokenConditioner', name, value, valid)):
        MODELS.build(dict(type='TokenConditioner', **{name: value}))


@pytest.mark.parametrize('name, value, valid', INVALID, ids=IDS)
def test_setting_an_invalid_option_on_a_conditioner_is_refused_and_changes_nothing(name, value, valid):
    conditioner = MODELS.build(dict(type='TokenConditioner'))
    conditioner.where = 'CondSwinTransformer stage 0'
    before = conditioner.options
    with pytest.raises(ValueError, match=message('CondSwinTransformer stage 0', name, value, valid)):
        setattr(conditioner, name, value)
    assert conditioner.options is before


def test_combinations_are_checked_on_the_whole_set_also_when_one_option_changes():
    combination = (r"^condition_tokens: solver='newton_schulz' is invalid; use 'auto' or 'eigh' with mode='floor': "
                   r"Newton-Schulz computes mode='sigma_max' only \(floor and graying need the eigenvalues "
                   r'themselves\)$')
    with pytest.raises(ValueError, match=combination):
        ConditioningOptions(mode='floor', solver='newton_schulz')
    with pytest.raises(ValueError, match=combination):
        ConditioningOptions(solver='newton_schulz').replace(mode='floor')
    conditioner = MODELS.build(dict(type='TokenConditioner', solver='newton_schulz'))
    with pytest.raises(ValueError, match=combination.replace('condition_tokens', 'TokenConditioner')):
        conditioner.mode = 'floor'
    assert conditioner.mode == 'sigma_max'


def test_alpha_as_a_tensor_must_be_a_0_dim_floating_cpu_tensor():
    strength = torch.tensor(0.5, dtype=torch.float64)
    assert ConditioningOptions(alpha=strength).alpha is strength  # used as it is, not copied
    for bad in (torch.ones(2), torch.tensor(1)):
        with pytest.raises(ValueError, match=r'^condition_tokens: alpha=tensor\(.*\) is invalid; use a number in '
                                             r'\[0, 100\] or a 0-dim floating CPU tensor \(got torch\.\w+ of shape'):
            ConditioningOptions(alpha=bad)



@pytest.mark.parametrize('solver', ['auto', 'reference_gram'])
def test_a_tensor_alpha_written_after_the_options_were_made_is_checked_at_the_call(solver):
    # a schedule updates the tensor in place; the batched path flags it in its status without reading it (at once
    # on the CPU), the reference reads it; NaN is named as alpha, not as an overflow of X + C
    strength = torch.tensor(0.5, dtype=torch.float64)
    options = ConditioningOptions(alpha=strength, solver=solver, where='stage 0')
    x = torch.nn.functional.layer_norm(torch.randn(2, 40, 8), (8, ))
    for bad in (-3.0, 1e30, float('nan')):
        strength.fill_(bad)
        valid = 'a number in [0, 100] (1 reaches the bound, 0 disables the correction)'
        with pytest.raises(ValueError, match=message('stage 0', 'alpha', strength, valid)):
            condition_tokens(x, options=options)
        with pytest.raises(ValueError, match=message('stage 0', 'alpha', strength, valid)):
            condition_valid_regions(x.view(2, 5, 8, 8), [(5, 8), (2, 3)], options=options)
    strength.fill_(0.25)
    assert torch.equal(condition_tokens(x, options=options), condition_tokens(x, alpha=0.25, solver=solver))


@pytest.mark.parametrize('options, name, valid', [
    (dict(detach=False, solver='newton_schulz'), 'solver',
     "'auto', 'reference_gram' or 'reference_svd' with detach=False: the gradient through the SVD runs on the "
     "float64 reference ('auto': 'reference_gram')"),
    (dict(detach=False, solver='eigh'), 'solver',
     "'auto', 'reference_gram' or 'reference_svd' with detach=False: the gradient through the SVD runs on the "
     "float64 reference ('auto': 'reference_gram')"),
    (dict(solver='reference_svd', check=False), 'check',
     "True or 'auto' with solver='reference_svd': the reference reads every value on the host and cannot run on "
     'non-finite tokens, so it always raises at once'),
    (dict(detach=False, check=False), 'check',
     "True or 'auto' with detach=False (the gradient through the SVD runs on the float64 reference): the reference "
     'reads every value on the host and cannot run on non-finite tokens, so it always raises at once'),
])
def test_options_the_reference_path_would_ignore_are_refused(options, name, valid):
    with pytest.raises(ValueError, match=message('condition_tokens', name, options[name], valid)):
        ConditioningOptions(**options)
    with pytest.raises(ValueError, match=message('condition_tokens', name, options[name], valid)):
        condition_tokens(torch.randn(2, 12, 4), **options)
    conditioner = MODELS.build(dict(type='TokenConditioner', **{name: options[name]}))
    with pytest.raises(ValueError, match=message('TokenConditioner', name, options[name], valid)):
        conditioner.options = conditioner.options.replace(**options)


@pytest.mark.parametrize('name, value, error', [
    ('scope', 'nonsense', "scope='nonsense' is invalid; use one of 'image', 'window'"),
    ('position', 'output', "position='output' is invalid; use one of 'embedding', 'attention_input'"),
    ('window_size', 4, "window_size=4 and shift_size=0 are invalid with scope='image'"),
    ('shift_size', 4, 'shift_size=4 is invalid; use an integer in [0, window_size=4)'),
    ('mode', 'graying_dct', "mode='graying_dct' is invalid per attention window"),
])
def test_the_placement_is_checked_when_one_of_its_arguments_is_set_after_the_build(name, value, error):
    scope = dict(scope='window', window_size=4) if name in ('mode', 'shift_size') else {}
    conditioner = MODELS.build(dict(type='TokenConditioner', **scope))
    before = {key: getattr(conditioner, key) for key in ('scope', 'window_size', 'shift_size', 'position', 'mode')}
    with pytest.raises(ValueError, match='^TokenConditioner: ' + re.escape(error)):
        setattr(conditioner, name, value)
    assert {key: getattr(conditioner, key) for key in before} == before


def test_valid_shapes_none_is_refused_by_name():
    with pytest.raises(ValueError, match=r'^condition_valid_regions: valid_shapes=None is invalid; use one \(h, w\) '
                                         r'pair of non-negative integers per image, or an integer \(B, 2\) tensor'):
        condition_valid_regions(torch.randn(2, 3, 4, 4), None)


def test_unknown_options_are_refused_naming_the_options():
    names = 'mode, alpha, target_kappa, detach, solver, centred, epsilon, check, control, where'
    with pytest.raises(TypeError, match=rf"^condition_tokens: unknown conditioning option\(s\) \['modee'\]; the "
                                        rf'options are {names}$'):
        condition_tokens(torch.randn(4, 2), modee='floor')
    with pytest.raises(TypeError, match=r"^TokenConditioner: unknown conditioning option\(s\) \['kappa'\]"):
        MODELS.build(dict(type='TokenConditioner', kappa=2.0))
    with pytest.raises(TypeError, match=r'^condition_tokens: options must be a ConditioningOptions \(or None, with '
                                        r"keyword options such as mode='floor'\), got str$"):
        condition_tokens(torch.randn(4, 2), 'floor')


def test_an_options_object_gives_what_its_keywords_give():
    x = random_tokens(2, 60, 8, 1e3)
    options = ConditioningOptions(mode='floor', alpha=0.5, target_kappa=3.0, centred=True)
    assert torch.equal(condition_tokens(x, options=options),
                       condition_tokens(x, mode='floor', alpha=0.5, target_kappa=3.0, centred=True))
    # keywords on top of an options object override it
    assert torch.equal(condition_tokens(x, options=options, mode='sigma_max'),
                       condition_tokens(x, mode='sigma_max', alpha=0.5, target_kappa=3.0, centred=True))
    grid = x.view(2, 6, 10, 8)
    assert torch.equal(condition_valid_regions(grid, [(6, 10), (3, 7)], options=options),
                       condition_valid_regions(grid, [(6, 10), (3, 7)], mode='floor', alpha=0.5, target_kappa=3.0,
                                               centred=True))
    assert torch.equal(condition_token_windows(x, (6, 10), 4, 2, options=options),
                       condition_token_windows(x, (6, 10), 4, 2, mode='floor', alpha=0.5, target_kappa=3.0,
                                               centred=True))


def test_a_conditioner_holds_one_options_object_and_forwards_it():
    cfg = dict(mode='floor', alpha=0.5, target_kappa=3, centred=True, solver='eigh')
    conditioner = MODELS.build(dict(type='TokenConditioner', **cfg))
    assert conditioner.options == ConditioningOptions(**cfg)  # `where` is a name, not an option of the math
    assert (conditioner.target_kappa, type(conditioner.target_kappa)) == (3.0, float)
    x = random_tokens(2, 60, 8, 1e3)
    assert torch.equal(conditioner(x), condition_tokens(x, **cfg))
    conditioner.alpha = 0.25  # what a strength schedule does between iterations
    assert conditioner.options == ConditioningOptions(**dict(cfg, alpha=0.25))
    assert torch.equal(conditioner(x), condition_tokens(x, **dict(cfg, alpha=0.25)))
    for name in ConditioningOptions.names():
        if name != 'where':
            assert f'{name}=' in repr(conditioner) or name == 'epsilon'


def test_options_are_frozen_and_normalised():
    options = ConditioningOptions(alpha=1, target_kappa=2, epsilon=1)
    assert [type(value) for value in (options.alpha, options.target_kappa, options.epsilon)] == [float] * 3
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.mode = 'floor'
    assert options.replace(where='elsewhere') == options and options.replace(mode='floor') != options
