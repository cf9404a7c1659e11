"""Each variant's config with the comparison's settings, its training in this process, and the check that it starts
from the reference's initial weights."""
import os.path as osp

import torch
from mmengine.hooks import Hook
from mmengine.runner import Runner
from mmengine.utils import import_modules_from_strings

from condtok_mm.suites.plan import resolved_config
from condtok_mm.utils import fall_back_from_amp_on_cpu


def variant_config(name, config, options, out_dir, iters, interval, seed, lr=None):
    """The variant's config with ``options`` merged and the comparison's settings applied.

    Args:
        name (str): the variant's name (its work dir OUT_DIR/NAME, its runner's instance names).
        config (str): its config file.
        options (list[str]): KEY=VALUE overrides, applied in order (every variant's, then its own).
        out_dir (str): the comparison's folder.
        iters (int): training iterations.
        interval (int): TrainingDynamicsHook records every this many iterations.
        seed (int): ``randomness.seed``: the same initial weights and data order for every variant.
        lr (float, optional): the base learning rate (default: the config's).
    """
    cfg = resolved_config(config, options)
    if cfg.get('custom_imports'):  # what Config.fromfile imports, which resolved_config leaves to the tools
        import_modules_from_strings(**cfg.custom_imports)
    cfg.work_dir = osp.join(out_dir, name)
    # Runners built in one process share the MessageHub and Visualizer instance of a name: give each its own.
    cfg.experiment_name = f'training_dynamics_{name}'
    if isinstance(cfg.get('visualizer'), dict):
        cfg.visualizer.name = f'training_dynamics_{name}'
        backends = cfg.visualizer.setdefault('vis_backends', [])
        if not any(backend.get('type') == 'LocalVisBackend' for backend in backends):
            backends.append(dict(type='LocalVisBackend'))  # the curves are read back from its scalars.json
    cfg.merge_from_dict({'randomness.seed': seed})
    # Iterations instead of epochs; an epoch-based scheduler is converted to the iterations it covers, so every
    # iteration gets the learning rate the config gives it.
    cfg.train_cfg = dict(type='IterBasedTrainLoop', max_iters=iters, val_interval=iters + 1)
    schedulers = cfg.get('param_scheduler') or []
    for scheduler in [schedulers] if isinstance(schedulers, dict) else schedulers:
        if scheduler.get('by_epoch', True):
            scheduler['convert_to_iter_based'] = True
    cfg.merge_from_dict({'log_processor.by_epoch': False})
    cfg.val_cfg = cfg.val_dataloader = cfg.val_evaluator = None
    cfg.default_hooks.checkpoint = None
    if lr is not None:
        cfg.optim_wrapper.optimizer.lr = lr
    hooks = [hook for hook in cfg.get('custom_hooks', []) if hook.get('type') != 'TrainingDynamicsHook']
    cfg.custom_hooks = hooks + [dict(type='TrainingDynamicsHook', interval=interval)]
    fall_back_from_amp_on_cpu(cfg)
    return cfg


class _WatchTraining(Hook):
    """The comparison's view of a run: the model's state dict when training starts, and the progress bar."""

    priority = 'VERY_HIGH'

    def __init__(self, progress):
        self.progress = progress
        self.initial_state = None

    def before_train(self, runner):
        model = runner.model.module if hasattr(runner.model, 'module') else runner.model
        self.initial_state = {key: value.detach().cpu().clone() for key, value in model.state_dict().items()}

    def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None):
        self.progress.update(1)


def train_variant(cfg, progress):
    """Train one variant; its scalars.json and its model's initial state dict.

    Args:
        cfg (Config): the variant's config (:func:`variant_config`).
        progress (tqdm): advanced by one every iteration.
    """
    runner = Runner.from_cfg(cfg)
    watch = _WatchTraining(progress)
    runner.register_hook(watch)
    runner.train()
    return osp.join(runner.log_dir, 'vis_data', 'scalars.json'), watch.initial_state


def compare_states(reference, other):
    """Whether two initial state dicts (``reference``, ``other``: {key: tensor}) are equal, for the backbone and
    for the whole model, and the first 20 keys that differ."""
    if set(reference) != set(other):
        differing = sorted(set(reference) ^ set(other))
        return dict(backbone_equal=False, model_equal=False, comparable=False, differing_keys=differing[:20])
    differing = [key for key in reference if not torch.equal(reference[key], other[key])]
    return dict(backbone_equal=not any(key.startswith('backbone.') for key in differing),
                model_equal=not differing, comparable=True, differing_keys=differing[:20])


def initial_weights_lines(initial, reference):
    """One markdown line per variant saying whether it starts from the reference's weights.

    Args:
        initial (dict): {variant: :func:`compare_states` against the reference}.
        reference (str): the reference's name.
    """
    lines = []
    for name, check in initial.items():
        if check['model_equal']:
            lines.append(f'- {name}: the same initial weights as {reference} (whole model)')
        elif check['backbone_equal']:
            lines.append(f'- {name}: the same initial backbone as {reference}; other parameters differ: '
                         f'{", ".join(check["differing_keys"])}')
        else:
            reason = ('the state dicts have different keys' if not check['comparable']
                      else 'the backbone parameters differ')
            lines.append(f'- {name}: NOT the same initial weights as {reference} ({reason}: '
                         f'{", ".join(check["differing_keys"])}); the comparison mixes initialisation '
                         'with the variant')
    return lines
