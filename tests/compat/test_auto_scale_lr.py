"""condtok_mm.compat.auto_scale_lr: --auto-scale-lr also scales the base_lr that the log reports."""
import pytest
from mmengine.runner import Runner

from condtok_mm import compat
from helpers.toy_runner import toy_cfg

# The tests below run the fixes in this process (the opt-in our tools and configs make); the tests of what a
# bare import leaves alone run in fresh processes (test_opt_in.py).
compat.apply()


def test_auto_scale_lr_scales_the_base_lr_the_log_reports(tmp_path):
    # two parameter groups (a custom lr_mult), so that the optimizer wrapper tracks base_lr in an extra group
    runner = Runner.from_cfg(toy_cfg(tmp_path, auto_scale_lr=dict(enable=True, base_batch_size=12),
                                     optim_wrapper=dict(paramwise_cfg=dict(custom_keys={
                                         'layers.0': dict(lr_mult=0.1)}))))
    optim_wrapper = runner.build_optim_wrapper(runner.optim_wrapper)
    runner.scale_lr(optim_wrapper, runner.auto_scale_lr)  # as Runner.train does; batch size 3 of 12
    assert [group['lr'] for group in optim_wrapper.optimizer.param_groups] == pytest.approx(
        [0.05 * 0.1 / 4] * 2 + [0.05 / 4] * 2)  # layers.0's weight and bias, then layers.2's
    assert optim_wrapper.base_param_settings['lr'] == pytest.approx(0.05 / 4)
