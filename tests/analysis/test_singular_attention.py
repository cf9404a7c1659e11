"""tools/analysis/singular_attention.py: the share of numerically singular matrices (κ > 2**24) per attention layer
of a cell's checkpoint against float64 numpy on the matrices the model computes, a matrix made exactly singular,
the checkpoint's SHA-256 and weights-only checks, a config naming a hook no longer registered, an all-zero image,
and the table per variant over seeds."""
import argparse
import hashlib
import json
import math
import shutil

import numpy as np
import pytest
import torch
from mmdet.models.backbones.swin import WindowMSA
from mmengine.config import Config
from mmengine.registry import init_default_scope
from mmengine.runner import Runner
from PIL import Image
from tqdm import tqdm

from condtok_mm.analysis import singular_attention
from condtok_mm.datasets import make_shapes_dataset
from condtok_mm.models.token_conditioner import TokenConditioner
from condtok_mm.registry import HOOKS, MODELS
from helpers.cfg_options import cfg_options_dict, data_options
from helpers.repo import DEMO, run_main

SINGULAR = 2.0 ** 24  # 1 / u, u = 2 ** -24 the unit roundoff of float32
OLD_HOOK = dict(type='AttentionConditioningHook', interval=100)  # the hook cells trained at 8641aba name
CONFIG_NAME = 'mask-rcnn_swin-mini-condtok_fpn_12e_shapes.py'
CELL = 'B_conditioned/lr0.001/seed3'


def shapes(folder, black=False, image_size=(128, 128)):
    """Three validation images (128 x 128: every stage's token grid a multiple of the 4 x 4 window, so that no
    window holds padding), black where asked."""
    make_shapes_dataset(str(folder), num_train=0, num_val=3, image_size=image_size, seed=5)
    if black:
        for path in (folder / 'val').glob('*.png'):
            Image.fromarray(np.zeros((128, 128, 3), np.uint8)).save(path)
    return str(folder)


def write_cell(work_dir, data_root, record=True, preprocessor='ValidRegionDetDataPreprocessor'):
    """A work dir as a training run leaves it: the dumped config (naming the hook 8641aba registered), a checkpoint
    of the demo model (initial weights, attention's q, k and v scaled) and, for a suite cell, its record with the
    checkpoint's SHA-256."""
    work_dir.mkdir(parents=True)
    cfg = Config.fromfile(DEMO)
    cfg.merge_from_dict(cfg_options_dict(data_options(data_root, 1)))
    cfg.val_dataloader.batch_size = 2  # a full batch and a partial one
    cfg.custom_hooks = [OLD_HOOK]
    cfg.model.data_preprocessor.type = preprocessor
    cfg.dump(str(work_dir / CONFIG_NAME))
    init_default_scope('mmdet')
    torch.manual_seed(0)
    model = MODELS.build(cfg.model)
    with torch.no_grad():  # attention as peaked as training makes it: numerically singular windows and others
        for attention in (m for m in model.backbone.modules() if isinstance(m, WindowMSA)):
            attention.qkv.weight *= 6
    torch.save(dict(meta=dict(epoch=1), state_dict=model.state_dict()), work_dir / 'epoch_1.pth')
    if record:
        digest = hashlib.sha256((work_dir / 'epoch_1.pth').read_bytes()).hexdigest()
        (work_dir / 'suite_cell.json').write_text(json.dumps(dict(
            variant='B_conditioned', config_file=f'configs/demo/{CONFIG_NAME}', commit='8641aba33594',
            checkpoint_sha256=digest, config=dict(custom_hooks=[OLD_HOOK]), seed=3, lr=0.001)))
    return str(work_dir)


@pytest.fixture(scope='module')
def cell(tmp_path_factory):
    root = tmp_path_factory.mktemp('singular_attention')
    return write_cell(root / CELL, shapes(root / 'shapes'))


@pytest.fixture(scope='module')
def measured(cell, tmp_path_factory):
    """The tool's result on the cell."""
    out = tmp_path_factory.mktemp('singular_attention_out')
    singular_attention.main([cell, '--out-dir', str(out)])
    return out


def numpy_kappa(matrices):
    s = np.linalg.svd(np.asarray(matrices, dtype=np.float64), compute_uv=False)
    with np.errstate(divide='ignore'):
        return s[..., 0] / s[..., -1]


@pytest.fixture(scope='module')
def reference(cell):
    """κ (float64 numpy SVD) of every matrix the cell's model computes on its validation images, captured with
    hooks of the test's own: the conditioner's input per image, each layer's softmax matrices and heads' outputs
    per window and head."""
    cfg = Config.fromfile(f'{cell}/{CONFIG_NAME}')
    init_default_scope('mmdet')
    model = MODELS.build(cfg.model)
    model.load_state_dict(torch.load(f'{cell}/epoch_1.pth', weights_only=True)['state_dict'])
    model.eval()
    captured = {}

    def keep(key, matrices):
        captured.setdefault(key, []).append(numpy_kappa(matrices.double().numpy()))

    def softmax_hook(layer):
        return lambda module, args, out: keep(f'attn_softmax/layer{layer:02d}', out.reshape(-1, *out.shape[-2:]))

    def heads_hook(layer, heads):
        def hook(module, args):
            x = args[0]  # (windows, tokens, C), the heads' outputs side by side
            per_head = x.reshape(x.shape[0], x.shape[1], heads, -1).permute(0, 2, 1, 3)
            keep(f'attn_out/layer{layer:02d}', per_head.reshape(-1, *per_head.shape[-2:]))
        return hook

    attentions = [m for m in model.backbone.modules() if isinstance(m, WindowMSA)]
    for layer, attention in enumerate(attentions):
        attention.softmax.register_forward_hook(softmax_hook(layer))
        attention.proj.register_forward_pre_hook(heads_hook(layer, attention.num_heads))
    (conditioner, ) = [m for m in model.backbone.modules() if isinstance(m, TokenConditioner)]
    conditioner.register_forward_hook(lambda module, args, kwargs, out: keep('tokens_in/stage0', args[0]),
                                      with_kwargs=True)
    loader_cfg = cfg.val_dataloader.copy()
    loader_cfg.update(num_workers=0, persistent_workers=False)
    with torch.no_grad():
        for batch in Runner.build_dataloader(loader_cfg):
            model.test_step(batch)
    assert len(attentions) == 5  # depths (1, 1, 2, 1)
    return {key: np.concatenate(values) for key, values in captured.items()}


def test_shares_and_resolved_kappa_equal_float64_numpy_on_every_window(measured, reference):
    result = json.loads((measured / 'B_conditioned_lr0.001_seed3.json').read_text())
    assert (result['num_images'], result['split'], result['checked']) == (3, 'val', True)
    for key, kappas in reference.items():
        singular = kappas > SINGULAR
        resolved = kappas[~singular]
        got = result['quantities'][key]
        assert (got['matrices'], got['singular']) == (kappas.size, singular.sum()), key
        assert got['share'] == pytest.approx(singular.mean(), abs=1e-12)
        if resolved.size:
            assert got['resolved_median'] == pytest.approx(np.median(resolved), rel=1e-6)
            assert got['resolved_geomean'] == pytest.approx(math.exp(np.log(resolved).mean()), rel=1e-6)
        else:
            assert got['resolved_median'] is got['resolved_geomean'] is None
    # every window of every layer: 3 images of 32x32, 16x16, 8x8, 8x8, 4x4 tokens in 4x4 windows, 1-8 heads
    windows = [3 * 64 * 1, 3 * 16 * 2, 3 * 4 * 4, 3 * 4 * 4, 3 * 1 * 8]
    assert [result['quantities'][f'attn_softmax/layer{i:02d}']['matrices'] for i in range(5)] == windows
    singular = [reference[f'{q}/layer{i:02d}'] > SINGULAR for q in ('attn_softmax', 'attn_out') for i in range(5)]
    assert all(0 < s.mean() < 1 for s in singular)  # both kinds of windows in every layer


def test_counting_at_the_float32_threshold():
    kappas = np.array([1.0, 4.0, SINGULAR, np.nextafter(SINGULAR, np.inf), 1e16])
    assert singular_attention.summarise(kappas) == dict(
        matrices=5, singular=2, share=0.4, resolved_median=4.0, resolved_geomean=pytest.approx((4 * SINGULAR) ** (1 / 3)))


def test_a_softmax_matrix_made_exactly_singular_counts_as_singular(cell, reference):
    info = singular_attention.read_cell(cell, None)
    model = singular_attention.load_model(info['cfg'], info['checkpoint'])
    first = next(m for m in model.backbone.modules() if isinstance(m, WindowMSA))

    def repeat_first_row(module, args, out):
        out = out.clone()
        out[..., 1, :] = out[..., 0, :]  # two equal rows: rank deficient, in any arithmetic
        return out

    first.softmax.register_forward_hook(repeat_first_row)
    loader = singular_attention.build_loader(info['cfg'], 'val', None)
    kappas = singular_attention.measure(model, loader, tqdm(disable=True))
    summary = singular_attention.summarise(kappas['kappas']['attn_softmax/layer00'])
    assert summary['singular'] == summary['matrices'] == reference['attn_softmax/layer00'].size
    assert (reference['attn_softmax/layer00'] <= SINGULAR).any()  # not so without the change
    assert summary['resolved_median'] is None


@pytest.mark.parametrize('recorded', ['0' * 64, None])
def test_a_checkpoint_other_than_the_tested_one_is_refused(cell, tmp_path, recorded):
    copy = shutil.copytree(cell, tmp_path / CELL)
    record = json.loads((copy / 'suite_cell.json').read_text())
    (copy / 'suite_cell.json').write_text(json.dumps({**record, 'checkpoint_sha256': recorded}))
    result = run_main(singular_attention.main, 'singular_attention.py', str(copy), '--out-dir', str(tmp_path / 'out'))
    assert result.returncode == 1
    if recorded:
        assert f'{copy}/epoch_1.pth has SHA-256 {record["checkpoint_sha256"]}, but' in result.stderr
        assert f'records {recorded} for the checkpoint the cell was tested with' in result.stderr
    else:
        assert 'records no checkpoint SHA-256 (the cell has not been tested)' in result.stderr
    assert not (tmp_path / 'out').exists()


def test_a_checkpoint_that_would_run_code_is_refused(cell, tmp_path):
    copy = shutil.copytree(cell, tmp_path / CELL)
    checkpoint = torch.load(copy / 'epoch_1.pth', weights_only=True)
    torch.save({**checkpoint, 'meta': argparse.Namespace(epoch=1)}, copy / 'epoch_1.pth')  # a class, not weights
    record = json.loads((copy / 'suite_cell.json').read_text())
    digest = hashlib.sha256((copy / 'epoch_1.pth').read_bytes()).hexdigest()
    (copy / 'suite_cell.json').write_text(json.dumps({**record, 'checkpoint_sha256': digest}))
    result = run_main(singular_attention.main, 'singular_attention.py', str(copy), '--out-dir', str(tmp_path / 'out'))
    assert result.returncode == 1
    assert 'argparse.Namespace' in result.stderr


def test_a_dumped_config_naming_a_hook_no_longer_registered_loads(cell, tmp_path):
    cfg = Config.fromfile(f'{cell}/{CONFIG_NAME}')
    assert cfg.custom_hooks == [OLD_HOOK]
    with pytest.raises(KeyError, match="type='AttentionConditioningHook' is not a condtok_mm hook"):
        HOOKS.build(cfg.custom_hooks[0])
    result = run_main(singular_attention.main, 'singular_attention.py', cell, '--out-dir', str(tmp_path),
                      '--max-images', '1')
    assert result.returncode == 0, result.stderr
    assert json.loads((tmp_path / 'B_conditioned_lr0.001_seed3.json').read_text())['num_images'] == 1


def test_an_all_zero_image_gives_finite_results(tmp_path):
    work_dir = write_cell(tmp_path / 'zeros', shapes(tmp_path / 'black', black=True), record=False)
    result = run_main(singular_attention.main, 'singular_attention.py', work_dir, '--out-dir', str(tmp_path / 'out'),
                      '--checkpoint', 'epoch_1.pth', '--max-images', '1')
    assert result.returncode == 0, result.stderr

    def refuse(constant):
        raise AssertionError(f'{constant} in the JSON')

    cell = json.loads((tmp_path / 'out' / 'zeros.json').read_text(), parse_constant=refuse)
    assert cell['checked'] is False and cell['variant'] is None
    for key, summary in cell['quantities'].items():
        assert 0 <= summary['share'] <= 1 and summary['singular'] <= summary['matrices'], key
        for value in (summary['resolved_median'], summary['resolved_geomean']):
            assert value is None or 1 <= value <= SINGULAR, key
    # a constant image embeds as one token repeated: a rank-one token matrix
    assert cell['quantities']['tokens_in/stage0'] == dict(matrices=1, singular=1, share=1.0, resolved_median=None,
                                                          resolved_geomean=None)
    json.loads((tmp_path / 'out' / 'singular_attention.json').read_text(), parse_constant=refuse)


def test_padded_images_measured_with_their_padding_are_counted(tmp_path):
    """80 x 128 images are padded to 96 x 128; mmdet's DetDataPreprocessor records no valid region, so the probe
    measures their padding's windows too, and the result says how many images that holds."""
    data_root = shapes(tmp_path / 'short', image_size=(80, 128))
    work_dir = write_cell(tmp_path / 'plain', data_root, record=False, preprocessor='DetDataPreprocessor')
    result = run_main(singular_attention.main, 'singular_attention.py', work_dir, '--out-dir', str(tmp_path / 'out'),
                      '--checkpoint', 'epoch_1.pth', '--max-images', '2')
    assert result.returncode == 0, result.stderr
    assert '2 padded images measured with their padding' in result.stdout + result.stderr
    assert json.loads((tmp_path / 'out' / 'plain.json').read_text())['padded_images'] == 2


def cell_result(variant, lr, seed, shares):
    quantities = {f'attn_softmax/layer{i:02d}': dict(matrices=8, singular=round(8 * s), share=s,
                                                     resolved_median=None, resolved_geomean=None)
                  for i, s in enumerate(shares)}
    return dict(name=f'{variant}_lr{lr:g}_seed{seed}', variant=variant, lr=lr, seed=seed, quantities=quantities)


def test_the_table_gives_each_variant_its_mean_share_over_seeds_and_counts_its_comparisons(tmp_path):
    results = [cell_result('A_baseline', 1e-3, 9, [0.25, 1.0]), cell_result('A_baseline', 1e-3, 10, [0.5, 0.875]),
               cell_result('B_conditioned', 2e-3, 9, [0.0, 0.125]), cell_result('B_conditioned', 1e-3, 9, [0.5, 0.5]),
               cell_result('D_norm_matched', 1e-3, 9, [0, 0])]
    arms = singular_attention.arms_of(results)
    assert [arm['arm'] for arm in arms] == ['A_baseline (lr0.001)', 'B_conditioned (lr0.002)',
                                            'B_conditioned (lr0.001)', 'D_norm_matched (lr0.001)']
    assert arms[0]['shares']['attn_softmax/layer00']['mean'] == pytest.approx(0.375)
    assert arms[0]['shares']['attn_softmax/layer01']['mean'] == pytest.approx(0.9375)
    text = singular_attention.markdown(arms, 'val')
    assert '| 37.5 % (seed 9 25 %, seed 10 50 %) | 0 % (seed 9 0 %) | 50 % (seed 9 50 %) | 0 % (seed 9 0 %) |' in text
    assert '2 rows × 4 arms; read across arms the table holds 12 pairwise comparisons, none tested and none ' \
           'corrected for multiplicity' in text
    singular_attention.plot(arms, str(tmp_path / 'shares.png'))
    assert (tmp_path / 'shares.png').stat().st_size > 0


def test_the_combined_outputs(measured):
    combined = json.loads((measured / 'singular_attention.json').read_text())
    assert combined['singular_kappa'] == SINGULAR and combined['split'] == 'val'
    assert [arm['arm'] for arm in combined['arms']] == ['B_conditioned (lr0.001)']
    assert 'B_conditioned (lr0.001)' in (measured / 'singular_attention.md').read_text()
    assert (measured / 'singular_attention.png').stat().st_size > 0


def test_cells_measured_on_earlier_runs_into_the_folder_stay_in_the_table(cell, tmp_path):
    out = tmp_path / 'out'
    out.mkdir()
    earlier = dict(cell_result('A_baseline', 1e-3, 3, [0.5, 1.0]), split='val')
    (out / f'{earlier["name"]}.json').write_text(json.dumps(earlier))
    result = run_main(singular_attention.main, 'singular_attention.py', cell, '--out-dir', str(out), '--max-images',
                      '1')
    assert result.returncode == 0, result.stderr
    combined = json.loads((out / 'singular_attention.json').read_text())
    assert [c['name'] for c in combined['cells']] == ['A_baseline_lr0.001_seed3', 'B_conditioned_lr0.001_seed3']
    assert [arm['arm'] for arm in combined['arms']] == ['A_baseline (lr0.001)', 'B_conditioned (lr0.001)']
    other_split = dict(cell_result('A_baseline', 1e-3, 4, [0.5, 1.0]), split='test')
    (out / f'{other_split["name"]}.json').write_text(json.dumps(other_split))
    result = run_main(singular_attention.main, 'singular_attention.py', cell, '--out-dir', str(out), '--max-images',
                      '1')
    assert result.returncode != 0
    assert "measured on the 'test' split and this run on 'val'" in result.stderr
