"""What a suite asks the runner to train at each stage, and which epochs its cells validate after."""
from types import SimpleNamespace

from mmengine.runner.loops import EpochBasedTrainLoop
from mmengine.runner.utils import calc_dynamic_intervals

from condtok_mm.suites.plan import cells_of_stage
from condtok_mm.suites.schema import phase_of


def stage(suite, name, out_dir, cells=()):
    """The cells of the suite's stage ``name`` of its first phase, given the finished ``cells`` of earlier stages."""
    return cells_of_stage(suite, 0, name, phase_of(suite), list(cells), str(out_dir), [])


def validated_epochs(train_cfg):
    """The epochs mmengine's EpochBasedTrainLoop validates after: its run loop's test, with the interval its own
    _decide_current_val_interval sets after each epoch (mmengine 0.10)."""
    milestones, intervals = calc_dynamic_intervals(train_cfg.val_interval, train_cfg.get('dynamic_intervals'))
    loop = SimpleNamespace(dynamic_milestones=milestones, dynamic_intervals=intervals)
    epochs = []
    for epoch in range(1, train_cfg.max_epochs + 1):  # the loop's self._epoch after the epoch
        loop.epoch = epoch
        EpochBasedTrainLoop._decide_current_val_interval(loop)
        if epoch % loop.val_interval == 0 or epoch == train_cfg.max_epochs:
            epochs.append(epoch)
    return epochs


def split_tested(cfg, annotations):
    """The split a cell's test command reads: 'val' or 'test' where the test dataloader's annotation file and image
    folder and the test evaluator's annotation file (under ``annotations``, the data root's annotations/) all name
    it; None otherwise."""
    for split in ('val', 'test'):
        if (cfg.test_dataloader.dataset.ann_file == f'annotations/instances_{split}.json'
                and cfg.test_dataloader.dataset.data_prefix.img == f'{split}/'
                and cfg.test_evaluator.ann_file == f'{annotations}instances_{split}.json'):
            return split
    return None
