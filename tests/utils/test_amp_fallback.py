"""condtok_mm.utils.fall_back_from_amp_on_cpu: an AMP config trains in float32 where no GPU can run it."""
import logging
import uuid

import pytest
import torch
from mmengine.config import Config
from mmengine.logging import MMLogger

from condtok_mm.utils import fall_back_from_amp_on_cpu

AMP_WARNING = 'AMP needs a GPU and none is available: training in float32 with OptimWrapper instead.'


def amp_config():
    return Config(dict(optim_wrapper=dict(type='AmpOptimWrapper', loss_scale='dynamic', dtype='bfloat16',
                                          optimizer=dict(type='AdamW', lr=1e-4), clip_grad=None)))


@pytest.fixture
def warnings_logged():
    """The WARNING messages of the current MMLogger (where the tools' print_log(logger='current') goes)."""
    logger = MMLogger.get_instance(f'runtime_{uuid.uuid4().hex}')  # the newest instance is the current one
    messages = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = lambda record: messages.append(record.getMessage())
    logger.addHandler(handler)
    yield messages
    logger.removeHandler(handler)


def test_amp_config_without_gpu_trains_in_float32_with_a_warning(monkeypatch, warnings_logged):
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: False)
    cfg = amp_config()
    fall_back_from_amp_on_cpu(cfg)
    assert cfg.optim_wrapper == dict(type='OptimWrapper', optimizer=dict(type='AdamW', lr=1e-4), clip_grad=None)
    assert warnings_logged == [AMP_WARNING]


def test_amp_config_with_a_gpu_is_left_alone(monkeypatch, warnings_logged):
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: True)
    cfg = amp_config()
    fall_back_from_amp_on_cpu(cfg)
    assert cfg.optim_wrapper == amp_config().optim_wrapper
    assert warnings_logged == []


def test_a_float32_config_is_left_alone_without_gpu(monkeypatch, warnings_logged):
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: False)
    cfg = Config(dict(optim_wrapper=dict(type='OptimWrapper', optimizer=dict(type='SGD', lr=0.1))))
    fall_back_from_amp_on_cpu(cfg)
    assert cfg.optim_wrapper == dict(type='OptimWrapper', optimizer=dict(type='SGD', lr=0.1))
    assert warnings_logged == []
