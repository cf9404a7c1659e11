"""condtok_mm.compat.config_formatting: a config's text is formatted by yapf once, with the text yapf gives."""
import mmengine.config.config as config_module
from mmengine.config import Config

from condtok_mm import compat
from condtok_mm.compat import config_formatting
from helpers.toy_runner import toy_cfg

compat.apply()  # the opt-in our tools and configs make (test_opt_in.py checks a bare import leaves mmengine be)


def count_yapf_calls(monkeypatch):
    """A list that grows by one each time yapf itself formats a text (behind the fix's memo)."""
    calls, yapf_format_code = [], config_formatting._upstream_format_code

    def counted(*args, **kwargs):
        calls.append(args[0])
        return yapf_format_code(*args, **kwargs)

    monkeypatch.setattr(config_formatting, '_upstream_format_code', counted)
    config_formatting._format_once.cache_clear()
    return calls


def test_every_read_gives_yapfs_text_and_yapf_formats_each_text_once(monkeypatch, tmp_path):
    calls = count_yapf_calls(monkeypatch)
    cfg = Config(toy_cfg(tmp_path).to_dict())
    assert config_module.FormatCode is config_formatting.format_code
    first = cfg.pretty_text
    # the text is yapf's own: the same call made to yapf directly, with mmengine's style
    unformatted = calls[0]
    from yapf.yapflib.yapf_api import FormatCode
    expected, _ = FormatCode(unformatted, style_config=dict(
        based_on_style='pep8', blank_line_before_nested_class_or_def=True,
        split_before_expression_after_opening_paren=True))
    assert first == expected
    assert cfg.pretty_text == first and cfg.dump() == first  # what the runner's five reads do
    assert len(calls) == 1  # the later reads were kept
    # another config is formatted anew, and a change to a config changes its text
    cfg.train_cfg.max_epochs = 7
    changed = cfg.pretty_text
    assert changed != first and 'max_epochs=7' in changed and len(calls) == 2


def test_a_runner_formats_its_config_once(monkeypatch, tmp_path):
    from mmengine.runner import Runner
    calls = count_yapf_calls(monkeypatch)
    runner = Runner.from_cfg(toy_cfg(tmp_path))
    runner.call_hook('before_run')  # RuntimeInfoHook reads pretty_text here
    # the log, the dumped config, the visualizer's local backend and RuntimeInfoHook read the one formatted text
    assert len(calls) == 1
    assert (tmp_path / f'{runner.timestamp}.py').read_text() == runner.cfg.pretty_text
