"""ConditioningStrengthRampHook: the strength each training iteration runs with, against hand computations, on a
real mmengine Runner; resumed runs; the full strength for validation; the logged scalar."""
import glob
import json
import math
import os.path as osp

import pytest
import torch
import torch.nn as nn
from mmengine.evaluator import BaseMetric
from mmengine.model import BaseModel
from mmengine.runner import Runner
from torch.utils.data import Dataset

import condtok_mm.compat
from condtok_mm.engine.hooks.strength_ramp import ConditioningStrengthRampHook, ramp_strength
from condtok_mm.models import TokenConditioner


class Tokens(Dataset):
    def __len__(self):
        return 4

    def __getitem__(self, index):
        return dict(tokens=torch.randn(8, 4, generator=torch.Generator().manual_seed(index)))


class TwoConditioners(BaseModel):
    """Two conditioners (alpha 1 and 0.5 in their configs) in front of a linear layer; records the alpha of
    both at every forward, with the mode it ran in."""

    def __init__(self):
        super().__init__()
        self.first = TokenConditioner()
        self.second = TokenConditioner(alpha=0.5, control='norm_matched')
        self.linear = nn.Linear(4, 1)
        self.seen = []

    def forward(self, tokens, mode='tensor', data_samples=None):
        self.seen.append((self.training, self.first.alpha, self.second.alpha))
        out = self.linear(self.second(self.first(torch.stack(tokens))))  # pseudo_collate: a list of (8, 4)
        if mode == 'loss':
            return dict(loss=out.square().mean())
        return [dict(value=float(out.mean()))]


class Mean(BaseMetric):
    def process(self, data_batch, data_samples):
        self.results.extend(data_samples)

    def compute_metrics(self, results):
        return dict(mean=sum(r['value'] for r in results) / len(results))


def runner(work_dir, max_iters, ramp, resume=False, val_interval=None, by_epoch_loop=False):
    condtok_mm.compat.apply()  # exact --resume (random states), checkpoints that load weights-only
    loader = dict(dataset=Tokens(), sampler=dict(type='DefaultSampler', shuffle=False), batch_size=1,
                  num_workers=0)
    if by_epoch_loop:
        train_cfg = dict(by_epoch=True, max_epochs=max_iters)
    else:
        train_cfg = dict(by_epoch=False, max_iters=max_iters, val_interval=val_interval or max_iters + 1)
    validation = dict(val_dataloader=loader, val_cfg=dict(), val_evaluator=dict(type=Mean)) if val_interval else {}
    return Runner(model=TwoConditioners(), work_dir=str(work_dir), train_dataloader=loader, train_cfg=train_cfg,
                  optim_wrapper=dict(optimizer=dict(type='SGD', lr=0.01)), custom_hooks=[ramp],
                  default_hooks=dict(checkpoint=dict(type='CheckpointHook', interval=2, by_epoch=by_epoch_loop),
                                     logger=dict(type='LoggerHook', interval=1)),
                  randomness=dict(seed=0), resume=resume, **validation)


def train_alphas(model):
    """(alpha of the first conditioner, of the second) at each training forward, flattened."""
    return [alpha for training, first, second in model.seen if training for alpha in (first, second)]


def test_strength_is_the_hand_computed_ramp():
    assert [ramp_strength(i, 10) for i in (0, 3, 10, 15)] == [0.0, 0.3, 1.0, 1.0]
    # cosine: (1 - cos(pi t)) / 2
    assert ramp_strength(5, 10, 'cosine') == pytest.approx(0.5, abs=1e-15)
    assert ramp_strength(2, 10, 'cosine') == pytest.approx((1 - math.cos(0.2 * math.pi)) / 2, abs=1e-15)
    assert ramp_strength(2, 10, 'cosine') == pytest.approx(0.09549150281252629, abs=1e-15)
    assert ramp_strength(0, 10, 'cosine') == 0.0 and ramp_strength(12, 10, 'cosine') == 1.0


@pytest.mark.parametrize('shape', ['linear', 'cosine'])
@pytest.mark.slow
def test_each_training_iteration_runs_with_the_ramps_alpha_and_validation_with_the_full_one(tmp_path, shape):
    run = runner(tmp_path, max_iters=6, ramp=dict(type='ConditioningStrengthRampHook', length=4, shape=shape),
                 val_interval=3)
    run.train()
    hand = {'linear': [0, 0.25, 0.5, 0.75, 1, 1],
            'cosine': [0, (1 - math.sqrt(0.5)) / 2, 0.5, (1 + math.sqrt(0.5)) / 2, 1, 1]}[shape]
    assert train_alphas(run.model) == pytest.approx([a for s in hand for a in (s, 0.5 * s)], abs=1e-15)
    # validated after iterations 3 and 6 (strength 0.75 or 0.854 and 1 at that point): always the configs' alphas
    assert [(first, second) for training, first, second in run.model.seen if not training] == [(1.0, 0.5)] * 8
    # logged: one record per iteration (logger interval 1) in vis_data/scalars.json, as 'condtok/strength'
    scalars, = glob.glob(osp.join(str(tmp_path), '*', 'vis_data', 'scalars.json'))
    with open(scalars) as f:
        logged = [json.loads(line) for line in f]
    assert [r['condtok/strength'] for r in logged if 'condtok/strength' in r] == pytest.approx(hand, abs=1e-15)


@pytest.mark.slow
def test_a_resumed_run_continues_the_ramp_exactly(tmp_path):
    ramp = dict(type='ConditioningStrengthRampHook', length=5)
    whole = runner(tmp_path / 'whole', max_iters=6, ramp=ramp)
    whole.train()
    first = runner(tmp_path / 'resumed', max_iters=4, ramp=ramp)
    first.train()  # stops at iteration 4 (checkpoints at 2 and 4): an interrupted run
    resumed = runner(tmp_path / 'resumed', max_iters=6, ramp=ramp, resume=True)
    resumed.train()
    assert resumed.iter == 6
    assert train_alphas(first.model) + train_alphas(resumed.model) == train_alphas(whole.model)
    assert train_alphas(resumed.model) == pytest.approx([0.8, 0.4, 1.0, 0.5], abs=1e-15)
    # and the weights too, since the model sees the same tokens
    for key, value in whole.model.state_dict().items():
        torch.testing.assert_close(resumed.model.state_dict()[key], value, rtol=0, atol=0)


def test_by_epoch_counts_the_length_in_epochs_of_the_train_dataloader(tmp_path):
    # 4 iterations an epoch: 1 epoch = 4 iterations, rising every iteration
    run = runner(tmp_path, max_iters=2, ramp=dict(type='ConditioningStrengthRampHook', length=1, by_epoch=True),
                 by_epoch_loop=True)
    run.train()
    assert train_alphas(run.model)[::2] == pytest.approx([0, 0.25, 0.5, 0.75, 1, 1, 1, 1])


def test_a_model_without_conditioner_and_bad_arguments_fail_clearly(tmp_path):
    class Plain(TwoConditioners):
        def __init__(self):
            super().__init__()
            self.first = self.second = nn.Identity()

    run = runner(tmp_path, max_iters=1, ramp=dict(type='ConditioningStrengthRampHook', length=2))
    run.model = Plain()
    with pytest.raises(ValueError, match='has no TokenConditioner to ramp'):
        run.call_hook('before_train')
    for kwargs, message in ((dict(length=0), 'length=0'), (dict(length=2.5), 'length=2.5'),
                            (dict(length=2, shape='step'), "shape='step'"),
                            (dict(length=2, by_epoch=1), 'by_epoch=1')):
        with pytest.raises(ValueError, match=message):
            ConditioningStrengthRampHook(**kwargs)
    with pytest.raises(ValueError, match="shape='exp'"):
        ramp_strength(1, 2, 'exp')
