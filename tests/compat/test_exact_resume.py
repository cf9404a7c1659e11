"""condtok_mm.compat.exact_resume: a resumed run draws the random numbers of the uninterrupted run."""
import pytest
import torch
from mmengine.runner import Runner

from condtok_mm import compat
from helpers.toy_runner import toy_cfg

# The tests below run the fixes in this process (the opt-in our tools and configs make); the tests of what a
# bare import leaves alone run in fresh processes (test_opt_in.py).
compat.apply()


def test_a_resumed_run_draws_the_random_numbers_of_the_uninterrupted_run(tmp_path):
    # The toy run draws from torch (dropout, DataLoader seeds), numpy and Python (augmentation), and
    # validates after every epoch.
    uninterrupted = Runner.from_cfg(toy_cfg(tmp_path / 'uninterrupted'))
    uninterrupted.train()

    crashed = Runner.from_cfg(toy_cfg(tmp_path / 'resumed', custom_hooks=[dict(type='CrashInEpoch', epoch=1,
                                                                               batch_idx=2)]))
    with pytest.raises(RuntimeError, match='crash'):
        crashed.train()
    assert crashed.epoch == 1 and crashed.iter == 6
    resumed = Runner.from_cfg(toy_cfg(tmp_path / 'resumed', resume=True))
    resumed.train()

    expected = uninterrupted.model.state_dict()
    for name, tensor in resumed.model.state_dict().items():
        assert torch.equal(tensor, expected[name]), name
    assert resumed.message_hub.get_scalar('val/mean').current() == \
        uninterrupted.message_hub.get_scalar('val/mean').current()
