"""What mim reads: model-index.yml and the metafile.yml of every config folder."""
import glob
import os.path as osp
import re

import pytest
import yaml
from mmengine.config import Config

from helpers.repo import REPO_ROOT


def metafile_models():
    index = yaml.safe_load(open(osp.join(REPO_ROOT, 'model-index.yml')))
    assert sorted(index['Import']) == sorted(
        osp.relpath(p, REPO_ROOT) for p in glob.glob(osp.join(REPO_ROOT, 'configs', '*', 'metafile.yml')))
    for metafile in index['Import']:
        content = yaml.safe_load(open(osp.join(REPO_ROOT, metafile)))
        collections = {collection['Name'] for collection in content['Collections']}
        for model in content['Models']:
            assert model['In Collection'] in collections, model['Name']
            yield model


@pytest.mark.slow
def test_every_config_is_in_the_model_index_with_its_schedule():
    models = list(metafile_models())
    configs = {osp.relpath(p, REPO_ROOT) for p in glob.glob(osp.join(REPO_ROOT, 'configs', '**', '*.py'),
                                                            recursive=True)
               if not osp.relpath(p, REPO_ROOT).startswith(osp.join('configs', 'suites'))  # run_suite.py's, not models
               and '_base_' not in p}  # pieces the configs inherit (the demos' dataset), not models
    assert sorted(model['Config'] for model in models) == sorted(configs)
    for model in models:
        assert model['Name'] == osp.splitext(osp.basename(model['Config']))[0]
        train_cfg = Config.fromfile(osp.join(REPO_ROOT, model['Config']), import_custom_modules=False).train_cfg
        schedule = ({'Epochs': train_cfg.max_epochs} if 'max_epochs' in train_cfg else
                    {'Iterations': train_cfg.max_iters})
        assert model['Metadata'] == schedule, model['Config']


def test_coco_and_imagenet_results_are_marked_as_the_paper_or_the_zoo():
    # COCO and ImageNet were not run here: every such number names its source
    for model in metafile_models():
        for result in model.get('Results', []):
            if result['Dataset'] != 'Shapes':
                assert all(key.endswith(('(paper)', '(mmdet zoo)', '(mmdet projects/ViTDet)'))
                           for key in result['Metrics']), model['Name']


def test_each_config_folder_readme_links_its_configs_and_marks_every_number():
    for folder in ('swin', 'vitdet', 'xcit', 'classification', 'upernet'):
        readme = open(osp.join(REPO_ROOT, 'configs', folder, 'README.md')).read()
        for config in glob.glob(osp.join(REPO_ROOT, 'configs', folder, '*.py')):
            assert f'(./{osp.basename(config)})' in readme, (folder, config)
        rows = [line for line in readme.splitlines() if line.startswith('| ') and '[config]' in line]
        assert rows, folder
        for row in rows:
            for cell in row.strip('|').split('|'):
                cell = cell.strip()
                if re.fullmatch(r'\d+\.\d+.*', cell):  # a measurement (AP, mIoU, top-1, GB, fps)
                    assert cell.endswith(('(paper)', '(mmdet zoo)', '(mmdet projects/ViTDet)')), (folder, cell)
