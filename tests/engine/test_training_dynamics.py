"""TrainingDynamicsHook against a float64 hand computation, its silence between recordings, and
tools/analysis/compare_training_dynamics.py (condtok_mm.analysis.training_dynamics: its comparison by hand, and two
demo variants end to end)."""
import copy
import json
import math
import os.path as osp
import uuid
from types import SimpleNamespace

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from mmdet.models.backbones import SwinTransformer
from mmengine.hooks import Hook
from mmengine.model import BaseModel
from mmengine.runner import Runner
from torch.utils.data import Dataset

import condtok_mm  # noqa: F401  (registration)
from condtok_mm.engine.hooks.training_dynamics import TrainingDynamicsHook
from condtok_mm.models.layout import find_residual_blocks
from condtok_mm.models.backbones.vitdet_vit import ViTDetViT
from condtok_mm.registry import HOOKS
from condtok_mm.analysis.training_dynamics.compare import parse_args
from condtok_mm.analysis.training_dynamics.separation import separation
from condtok_mm.analysis.training_dynamics.variants import compare_states
from helpers.repo import DEMO, REPO_ROOT, run_tool

BASELINE_DEMO = osp.join(REPO_ROOT, 'configs', 'demo', 'mask-rcnn_swin-mini_fpn_12e_shapes.py')
# 2 images of 16 x 16 -> a 4 x 4 grid of 8 channels; block 0 attends in 2 x 2 windows, block 1 globally
IMAGES = torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(1))


class ToyModel(BaseModel):
    """A 2-block ViTDet backbone (a window block, then a global block) under a quadratic loss."""

    def __init__(self, with_cp=False):
        super().__init__()
        self.backbone = ViTDetViT(img_size=16, patch_size=4, embed_dim=8, depth=2, num_heads=2, drop_path_rate=0.,
                                  use_rel_pos=False, window_size=2, window_block_indexes=[0], pretrain_img_size=16,
                                  with_cp=with_cp)

    def init_weights(self):
        # weights of std 0.5 instead of ViTDet's 0.02: attention far from uniform, updates far from zero
        generator = torch.Generator().manual_seed(0)
        with torch.no_grad():
            for parameter in self.parameters():
                parameter.copy_(0.5 * torch.randn(parameter.shape, generator=generator))

    def forward(self, inputs, data_samples=None, mode='loss'):
        return dict(loss=((self.backbone(inputs) - 1)**2).mean())


class FixedImages(Dataset):
    def __len__(self):
        return len(IMAGES)

    def __getitem__(self, index):
        return dict(inputs=IMAGES[index])


class CountHooks(Hook):
    """After TrainingDynamicsHook in every call: how many forward hooks the model's modules and step pre-hooks
    its optimizer hold, while each iteration runs and after it."""

    priority = 'LOW'

    def __init__(self):
        self.during, self.after = [], []

    @staticmethod
    def _count(runner):
        modules = sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in runner.model.modules())
        return modules + len(runner.optim_wrapper.optimizer._optimizer_step_pre_hooks)

    def before_train(self, runner):
        self.before_training = self._count(runner)

    def before_train_iter(self, runner, batch_idx, data_batch=None):
        self.during.append(self._count(runner))

    def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None):
        self.after.append(self._count(runner))


def train_toy(work_dir, iters, interval, with_cp=False, extra_hooks=()):
    """Train ToyModel with SGD at lr 0 (the weights stay the initial ones) on the same batch every iteration;
    the model and {step: dynamics scalars} from its scalars.json."""
    name = f'toy_{uuid.uuid4().hex}'  # Runners in one process share MessageHub/Visualizer instances by name
    runner = Runner(
        model=ToyModel(with_cp), work_dir=str(work_dir), experiment_name=name,
        train_dataloader=dict(dataset=FixedImages(), sampler=dict(type='DefaultSampler', shuffle=False),
                              batch_size=len(IMAGES), num_workers=0, collate_fn=dict(type='default_collate')),
        train_cfg=dict(by_epoch=False, max_iters=iters), optim_wrapper=dict(optimizer=dict(type='SGD', lr=0.)),
        custom_hooks=[dict(type='TrainingDynamicsHook', interval=interval), *extra_hooks],
        default_hooks=dict(checkpoint=None), randomness=dict(seed=0),
        visualizer=dict(type='Visualizer', name=name, vis_backends=[dict(type='LocalVisBackend')]))
    runner.train()
    steps = {}
    with open(osp.join(runner.log_dir, 'vis_data', 'scalars.json')) as f:
        for line in f:
            record = json.loads(line)
            dynamics = {k[len('dynamics/'):]: v for k, v in record.items() if k.startswith('dynamics/')}
            if dynamics:
                steps.setdefault(record['step'], {}).update(dynamics)
    return runner.model, steps


def hand_dynamics(model, images):
    """Every quantity of the hook, computed in float64 from the weights, the attention written out."""
    model = copy.deepcopy(model).double()
    vit = model.backbone
    x = vit.add_abs_pos_embed(vit.patch_embed(images.double()))  # (B, H, W, C) stream entering block 0
    batch, height, width, channels = x.shape
    values = {}
    for index, block in enumerate(vit.blocks):
        name = f'blocks.{index}'
        attention, heads = block.attn, block.attn.num_heads
        normed = F.layer_norm(x, (channels, ), block.norm1.weight, block.norm1.bias, block.norm1.eps)
        size = block.window_size
        if size:  # (B * windows, size * size, C), windows row-major, as ViTDet cuts them (no padding here)
            groups = normed.reshape(batch, height // size, size, width // size, size, channels)
            groups = groups.permute(0, 1, 3, 2, 4, 5).reshape(-1, size * size, channels)
        else:
            groups = normed.reshape(batch, height * width, channels)
        q, k, v = (groups @ attention.qkv.weight.T + attention.qkv.bias).chunk(3, dim=-1)
        q, k, v = (t.reshape(t.shape[0], t.shape[1], heads, -1).transpose(1, 2) for t in (q, k, v))
        logits = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
        probabilities = torch.exp(logits - torch.logsumexp(logits, dim=-1, keepdim=True))
        values[f'attn_entropy/{name}'] = float(-(probabilities * torch.log(probabilities)).sum(-1).mean())
        heads_out = (probabilities @ v).transpose(1, 2).reshape(groups.shape)
        update = heads_out @ attention.proj.weight.T + attention.proj.bias
        if size:
            update = update.reshape(batch, height // size, width // size, size, size, channels)
            update = update.permute(0, 1, 3, 2, 4, 5)
        update = update.reshape(batch, height, width, channels)
        values[f'stream_rms/{name}'] = float(x.pow(2).mean().sqrt())
        values[f'attn_update_ratio/{name}'] = float(update.norm() / x.norm())
        x = x + update
        normed = F.layer_norm(x, (channels, ), block.norm2.weight, block.norm2.bias, block.norm2.eps)
        mlp = block.mlp
        update = F.gelu(normed @ mlp.fc1.weight.T + mlp.fc1.bias) @ mlp.fc2.weight.T + mlp.fc2.bias
        values[f'mlp_update_ratio/{name}'] = float(update.norm() / x.norm())
        x = x + update
    loss = ((x.permute(0, 3, 1, 2) - 1)**2).mean()
    loss.backward()
    values['loss'] = float(loss)
    for index, block in enumerate(vit.blocks):
        values[f'grad_norm/blocks.{index}'] = float(torch.nn.utils.get_total_norm(
            [p.grad for p in block.parameters()]))
    values['grad_norm_total'] = float(torch.nn.utils.get_total_norm([p.grad for p in model.parameters()]))
    return values


@pytest.mark.parametrize('with_cp', [False, True], ids=['plain', 'activation-checkpointing'])
@pytest.mark.slow
def test_recorded_values_equal_a_float64_hand_computation(tmp_path, with_cp):
    model, steps = train_toy(tmp_path, iters=3, interval=2, with_cp=with_cp)
    want = hand_dynamics(model, IMAGES)
    assert sorted(steps) == [1, 2]  # the first iteration, then every 2nd
    for step, got in steps.items():
        assert set(got) == set(want) | {'loss_smoothed'}
        for key, value in want.items():
            assert got[key] == pytest.approx(value, rel=1e-4), f'{key} at step {step}'
        # the loss is the same every iteration (same batch, same weights): its running mean is it too
        assert got['loss_smoothed'] == pytest.approx(got['loss'], rel=1e-6)
    # the hand values are not degenerate: attention is not uniform (that would be log 4 and log 16 nats)
    assert want["attn_entropy/blocks.0"] < 0.95 * math.log(4) and want["attn_entropy/blocks.1"] < 0.95 * math.log(16)


@pytest.mark.slow
def test_no_hook_is_registered_and_nothing_recorded_between_recordings(tmp_path):
    counter = CountHooks()
    _, steps = train_toy(tmp_path, iters=5, interval=3, extra_hooks=[counter])
    assert sorted(steps) == [1, 3]  # iterations 0 and 2 record; 1, 3 and 4 do not
    base = counter.before_training
    assert [count > base for count in counter.during] == [True, False, True, False, False]
    assert counter.after == [base] * 5  # whatever was registered for a recording is removed after it


def test_blocks_are_found_in_swin_and_vitdet_and_a_model_without_any_is_refused():
    swin = SwinTransformer(embed_dims=16, depths=(1, 2), num_heads=(1, 2), strides=(4, 2), out_indices=(0, 1),
                           window_size=4)
    # the backbone itself has output norms named norm1 (and norm0): it is not a block
    assert [name for name, _ in find_residual_blocks(swin)] == ['stages.0.blocks.0', 'stages.1.blocks.0',
                                                                  'stages.1.blocks.1']
    assert [name for name, _ in find_residual_blocks(ToyModel().backbone)] == ['blocks.0', 'blocks.1']
    hook = HOOKS.build(dict(type='TrainingDynamicsHook'))
    with pytest.raises(ValueError, match='Sequential has no pre-norm transformer block.*remove it from custom_hooks'):
        hook.before_train(SimpleNamespace(model=nn.Sequential(nn.Linear(2, 2))))
    with pytest.raises(ValueError, match='interval=0 is invalid'):
        TrainingDynamicsHook(interval=0)


def test_separation_is_the_first_and_the_lasting_departure_beyond_the_factor():
    reference = dict(iter=[1, 10, 20, 30, 40], value=[1., 1., 1., 1., 2.])
    # 1.6x at 10, back to 1x at 20, then 1/1.6x and 1.6x (2 x 0.8 at 40) to the end
    variant = dict(iter=[1, 10, 20, 30, 40], value=[1.2, 1.6, 1., 0.625, 3.2])
    assert separation(reference, variant, 1.5) == dict(first=10, sustained=30, end_step=40, end_ratio=1.6)
    assert separation(reference, variant, 2.0) == dict(first=None, sustained=None, end_step=40, end_ratio=1.6)
    # only common iterations with positive finite values count
    gappy = dict(iter=[1, 20, 30, 40], value=[1., 0., math.nan, 1.])
    assert separation(reference, gappy, 1.5) == dict(first=40, sustained=40, end_step=40, end_ratio=0.5)


def test_initial_weights_are_compared_key_by_key():
    reference = {'backbone.w': torch.ones(2), 'neck.w': torch.zeros(2)}
    assert compare_states(reference, copy.deepcopy(reference))['model_equal']
    other = dict(reference, **{'neck.w': torch.ones(2)})
    assert compare_states(reference, other) == dict(backbone_equal=True, model_equal=False, comparable=True,
                                                    differing_keys=['neck.w'])
    other = dict(reference, **{'backbone.v': torch.ones(1)})
    assert compare_states(reference, other)['comparable'] is False


def test_variant_arguments_are_checked():
    args = parse_args(['--variant', 'a', DEMO, '--variant', 'b', DEMO, 'model.backbone.conditioning.alpha=0.5'])
    assert args.variants['b']['cfg_options'] == ['model.backbone.conditioning.alpha=0.5']
    assert args.reference == 'a'
    for argv in (['--variant', 'a', DEMO], ['--variant', 'a', DEMO, '--variant', 'a', DEMO],
                 ['--variant', 'a', DEMO, '--variant', 'b', DEMO, 'alpha'],
                 ['--variant', 'a', DEMO, '--variant', 'b', DEMO, '--cfg-options', 'alpha'],
                 ['--variant', 'a', DEMO, '--variant', 'b', DEMO, '--reference', 'c']):
        with pytest.raises(SystemExit):
            parse_args(argv)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_two_demo_variants_end_to_end(shapes_root, tmp_path):
    out_dir = tmp_path / 'dynamics'
    output = run_tool('analysis/compare_training_dynamics.py', '--variant', 'baseline', BASELINE_DEMO, '--variant',
                      'condtok', DEMO, '--iters', '4', '--interval', '2', '--out-dir', str(out_dir),
                      '--cfg-options', f'train_dataloader.dataset.data_root={shapes_root}/',
                      'train_dataloader.num_workers=0', 'train_dataloader.persistent_workers=False')
    assert 'condtok: the same initial weights as baseline (whole model)' in output
    result = json.loads((out_dir / 'training_dynamics.json').read_text())
    assert result['initial_weights']['condtok']['model_equal']
    blocks = ['stages.0.blocks.0', 'stages.1.blocks.0', 'stages.2.blocks.0', 'stages.2.blocks.1',
              'stages.3.blocks.0']
    assert result['blocks'] == blocks
    for name in ('baseline', 'condtok'):
        curves = result['curves'][name]
        # the curves are what the run's own scalars.json holds
        with open(result['variants'][name]['scalars']) as f:
            records = [json.loads(line) for line in f]
        stored = [(r['step'], v) for r in records for k, v in r.items() if k == 'dynamics/stream_rms/stages.0.blocks.0']
        assert list(zip(curves['stream_rms/stages.0.blocks.0']['iter'],
                        curves['stream_rms/stages.0.blocks.0']['value'])) == stored
        assert curves['grad_norm_total']['iter'] == [1, 2, 4]
    # the correction makes the stream entering the first block several times larger, and nothing else does
    ratio = [c / b for b, c in zip(result['curves']['baseline']['stream_rms/stages.0.blocks.0']['value'],
                                   result['curves']['condtok']['stream_rms/stages.0.blocks.0']['value'])]
    assert all(r > 2 for r in ratio)
    first = {(row['quantity'], row['block']): row['variants']['condtok']['first'] for row in result['separation']}
    assert first[('stream_rms', 'stages.0.blocks.0')] == 1
    assert len(first) == 5 * len(blocks) + 3  # 5 quantities per block, loss, smoothed loss, total grad norm
    table = (out_dir / 'training_dynamics.md').read_text()
    assert '| stream_rms | stages.0.blocks.0 | 1 | 1 |' in table
    for png in ('stream_rms', 'attn_update_ratio', 'mlp_update_ratio', 'attn_entropy', 'grad_norm', 'global',
                'ratio_condtok_vs_baseline'):
        assert (out_dir / f'{png}.png').stat().st_size > 10_000
