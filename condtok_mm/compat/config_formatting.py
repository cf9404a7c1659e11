"""A config is formatted by yapf once per text, not at every read of ``Config.pretty_text`` (mends
mmengine/config/config.py).

mmengine 0.10.7 ``Config.pretty_text`` (config/config.py L1375-1490) formats the config's text with yapf's
``FormatCode`` every time it is read (docs/en/user_guides/runtime_fixes.md says what that costs), and one
training run reads it five times: ``Runner._log_env`` (runner/runner.py L2388),
``Runner.dump_config`` through ``Config.dump`` (config/config.py L1570), the visualizer's ``add_config`` for
the local backend (``Config.dump`` again) and for TensorBoard (visualization/vis_backend.py L572), and
``RuntimeInfoHook.before_run`` (hooks/runtime_info_hook.py L51). ``FormatCode`` is a pure function of the
text and the style, so its result is kept for the texts met (the same text gives the same formatted text, as
before): a run formats each config once.
"""
import functools
import json

import mmengine.config.config as config_module

_upstream_format_code = config_module.FormatCode
# a run formats a handful of configs (the training config and the ones tools derive from it); each is ~15 kB
FORMATTED_TEXTS_KEPT = 32


@functools.lru_cache(maxsize=FORMATTED_TEXTS_KEPT)
def _format_once(text: str, style: str, options: str):
    return _upstream_format_code(text, style_config=json.loads(style), **json.loads(options))


def format_code(unformatted_source, style_config=None, **options):
    """yapf's ``FormatCode`` as mmengine calls it (the text, a style dict and, for yapf < 0.40.2,
    ``verify=True``), kept per text, style and options; a call with a style that is not a dict of plain values
    goes to yapf unchanged."""
    try:
        key = json.dumps(style_config, sort_keys=True), json.dumps(options, sort_keys=True)
    except TypeError:
        key = None
    if key is None or not isinstance(style_config, dict):
        return _upstream_format_code(unformatted_source, style_config=style_config, **options)
    return _format_once(unformatted_source, *key)


def apply() -> None:
    config_module.FormatCode = format_code
