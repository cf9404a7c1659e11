"""A toy Runner setup for the compat tests: a model, dataset, metric and hook that draw from every random
generator mmengine's runs draw from, and :func:`toy_cfg`, a short run of them."""
import random
import uuid

import numpy as np
import torch
from mmengine.config import Config
from mmengine.evaluator import BaseMetric
from mmengine.hooks import Hook
from mmengine.model import BaseModel
from mmengine.registry import DATASETS, HOOKS, METRICS, MODELS
from torch import nn
from torch.utils.data import Dataset


@MODELS.register_module(force=True)
class DropoutRegressor(BaseModel):
    """A toy model that draws from torch's random generator when it trains (dropout)."""

    def __init__(self):
        super().__init__()
        self.layers = nn.Sequential(nn.Linear(2, 8), nn.Dropout(0.5), nn.Linear(8, 1))

    def forward(self, inputs, data_samples=None, mode='tensor'):
        outputs = self.layers(torch.stack(inputs)).squeeze(1)
        if mode == 'loss':
            return dict(loss=((outputs - torch.stack(data_samples))**2).mean())
        return outputs


@DATASETS.register_module(force=True)
class JitteredPoints(Dataset):
    """A toy dataset that draws from numpy's and Python's random generators for each item (augmentation)."""
    metainfo = {}

    def __len__(self):
        return 12

    def __getitem__(self, index):
        point = np.array([index / 12, 1.0]) + np.random.normal(0, 0.1, size=2)
        if random.random() < 0.5:
            point = point[::-1].copy()
        return dict(inputs=torch.tensor(point, dtype=torch.float32),
                    data_samples=torch.tensor(index % 3, dtype=torch.float32))


@METRICS.register_module(force=True)
class MeanPrediction(BaseMetric):

    def process(self, data_batch, data_samples):
        self.results.extend(float(x) for x in data_samples)

    def compute_metrics(self, results):
        return dict(mean=float(np.mean(results)))


@HOOKS.register_module(force=True)
class CrashInEpoch(Hook):
    """Stands for a kill: raises before the given iteration of the given (0-based) epoch."""

    def __init__(self, epoch, batch_idx):
        self.epoch, self.batch_idx = epoch, batch_idx

    def before_train_iter(self, runner, batch_idx, data_batch=None):
        if (runner.epoch, batch_idx) == (self.epoch, self.batch_idx):
            raise RuntimeError('crash')


def toy_cfg(work_dir, **options):
    cfg = Config(
        dict(
            work_dir=str(work_dir),
            experiment_name=f'toy_{uuid.uuid4().hex}',  # runners built in the same second differ
            model=dict(type='DropoutRegressor'),
            train_dataloader=dict(dataset=dict(type='JitteredPoints'), batch_size=3, num_workers=0,
                                  sampler=dict(type='DefaultSampler', shuffle=True)),
            val_dataloader=dict(dataset=dict(type='JitteredPoints'), batch_size=3, num_workers=0,
                                sampler=dict(type='DefaultSampler', shuffle=False)),
            val_evaluator=dict(type='MeanPrediction'),
            val_cfg=dict(),
            optim_wrapper=dict(optimizer=dict(type='SGD', lr=0.05)),
            train_cfg=dict(by_epoch=True, max_epochs=3, val_interval=1),
            default_hooks=dict(checkpoint=dict(type='CheckpointHook', interval=1)),
            randomness=dict(seed=0, deterministic=True)))
    cfg.merge_from_dict(options)
    return cfg
