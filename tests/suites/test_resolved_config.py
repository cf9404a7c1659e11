"""condtok_mm/suites/plan.py resolved_config: a config file is read once per run and each cell gets its own copy
with its options applied, equal to the file read afresh with those options and shared with no other cell."""
from mmengine.config import Config

from condtok_mm.suites import plan
from helpers.cfg_options import cfg_options_dict
from helpers.suite_runs import CONDITIONED

OPTIONS = ['randomness.seed=3', 'optim_wrapper.optimizer.lr=0.0005', 'train_cfg.max_epochs=2',
           'model.backbone.conditioning.control=scale_matched']


def read_afresh(options):
    cfg = Config.fromfile(CONDITIONED, import_custom_modules=False)
    if options:
        cfg.merge_from_dict(cfg_options_dict(options))
    return cfg.to_dict()


def test_each_cell_gets_the_file_as_read_afresh_with_its_options_and_a_copy_of_its_own(monkeypatch):
    plan.parsed_config.cache_clear()
    reads = []
    original = plan.Config.fromfile

    def spy(path, *args, **kwargs):
        reads.append(path)
        return original(path, *args, **kwargs)

    monkeypatch.setattr(plan.Config, 'fromfile', spy)
    first = plan.resolved_config(CONDITIONED, OPTIONS)
    second = plan.resolved_config(CONDITIONED, [])
    assert reads == [CONDITIONED]  # the second cell's config came from the one read
    monkeypatch.undo()
    assert first.to_dict() == read_afresh(OPTIONS)
    assert second.to_dict() == read_afresh([])  # the first cell's options did not reach the file as read
    assert first.model.backbone.conditioning.control == 'scale_matched'
    assert 'control' not in second.model.backbone.conditioning
    first.model.backbone.depths[0] = 99  # a cell's config changed in place changes no other
    first.train_cfg.max_epochs = 7
    third = plan.resolved_config(CONDITIONED, [])
    assert third.to_dict() == second.to_dict() == read_afresh([])
