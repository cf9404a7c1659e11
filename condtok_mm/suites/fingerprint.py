"""What defines a cell, recorded in its work dir when it starts, so that a resumed or gathered suite uses a
cell only when it is the cell asked for.

The fingerprint of a cell is its resolved config (the config file after every --cfg-options, as
tools/train.py reads it; canonical JSON), its options, seed, learning rate, the condtok_mm version and the
SHA-256 of the files the config reads that can change under the same path: the checkpoints it loads
(``init_cfg.checkpoint``, ``load_from``, local or http(s)://; a pretrained backbone trained again is another
cell) and the annotation files (``ann_file``, under its dataset's ``data_root``; images are not hashed). The work
dir is not part of it: a cell linked in from another suite's out dir (configs/suites/demo_dose_*.py) is the same
cell when these agree.

The record (``suite_cell.json``) holds the fingerprint and, beside it, RECORD_KEYS, and says its format under
FORMAT_KEY; a record without it is format 1. :func:`cell_record` reads every format into the current one:

    1  the fingerprint; of RECORD_KEYS and ``inputs`` any may be absent (read as None, not known), the digest of an
       http(s):// input may be None, and the config may name a hook by a name RENAMED_HOOKS maps (read as the
       name it maps to, so that the cell is the one a config naming the new type asks for)
    2  every key of FINGERPRINT_KEYS and RECORD_KEYS (None where not known: the commit outside a git checkout, the
       CPU under a launcher whose processes may run elsewhere, the checkpoint's digest until a test of it ended),
       hooks by their registered names
"""
import functools
import hashlib
import json
import os
import os.path as osp
import subprocess

from condtok_mm.compat.checkpoint_loading import download_url
from condtok_mm.engine.hooks.renamed import RENAMED_HOOKS
from condtok_mm.utils import write_whole_text
from condtok_mm.version import __version__
from .plan import resolved_config
from .results import UnreadableCellFile, is_integer, read_json

FINGERPRINT_FILE = 'suite_cell.json'
FINGERPRINT_KEYS = ('config', 'options', 'seed', 'lr', 'version', 'inputs')
RECORD_KEYS = ('variant', 'config_file', 'commit', 'wall_s', 'cpu', 'checkpoint_sha256')  # beside the fingerprint
FORMAT_KEY = 'record_format'
RECORD_FORMAT = 2  # the format write_fingerprint writes (the module docstring lists them)
HELD_OUT_KEY = 'test_options'  # in the fingerprint of a cell tested on a held-out split only
INPUT_KEYS = ('checkpoint', 'load_from', 'ann_file')  # config keys naming a file the cell reads
SHOWN_CONFIG_KEYS = 6  # differing config keys named in a message (the shallowest first); the rest are counted


def canonical(value):
    """``value`` as it reads back from JSON (tuples as lists, keys sorted, other objects by repr)."""
    return json.loads(json.dumps(value, sort_keys=True, default=repr))


def input_files(config, prefix=''):
    """{dotted key: path} of the files a config dict names under INPUT_KEYS: an ``ann_file`` joined to the
    ``data_root`` beside it (as mmengine's BaseDataset does), the other paths as written."""
    files = {}
    if isinstance(config, dict):
        for key, value in config.items():
            if key in INPUT_KEYS and isinstance(value, str) and value:
                root = config.get('data_root') if key == 'ann_file' else None
                files[prefix + key] = osp.join(root, value) if isinstance(root, str) else value
            else:
                files.update(input_files(value, f'{prefix}{key}.'))
    elif isinstance(config, (list, tuple)):
        for i, value in enumerate(config):
            files.update(input_files(value, f'{prefix}{i}.'))
    return files


@functools.lru_cache(maxsize=None)
def sha256(path, size, mtime_ns):
    """The file's SHA-256, once per (path, size, modification time) in a run."""
    digest = hashlib.sha256()
    with open(path, 'rb') as f:
        for block in iter(functools.partial(f.read, 1 << 20), b''):
            digest.update(block)
    return digest.hexdigest()


def file_digest(path, root):
    """'sha256:HEX' of a local file (relative paths from ``root``, where the tools run) or of an http(s)://
    checkpoint (the copy the cell loads, downloaded into the hub cache under the whole URL's name), or None for
    a file that is not there yet or a URL that cannot be fetched now."""
    if path.startswith(('http://', 'https://')):
        try:
            full = download_url(path)
        except OSError:  # urllib's URLError and HTTPError are OSErrors: the cell's own load will name it
            return None
    else:
        full = path if osp.isabs(path) else osp.join(root, path)
        if not osp.isfile(full):
            return None
    stat = os.stat(full)
    return 'sha256:' + sha256(osp.realpath(full), stat.st_size, stat.st_mtime_ns)


def fingerprint(cell, root):
    """The cell's fingerprint; ``root`` is the directory its commands run in (relative paths start there). A cell
    tested on a held-out split also records its test options (under HELD_OUT_KEY, which other cells' fingerprints
    do not have) and the files they name (the test's annotation files)."""
    cfg = canonical(resolved_config(cell.config_path, cell.options).to_dict())
    inputs = {key: dict(path=path, digest=file_digest(path, root)) for key, path in input_files(cfg).items()}
    record = dict(config=cfg, options=list(cell.options), seed=cell.seed, lr=cell.lr, version=__version__,
                  inputs=inputs)
    if cell.test_options:
        test_cfg = canonical(resolved_config(cell.config_path, [*cell.options, *cell.test_options]).to_dict())
        record[HELD_OUT_KEY] = list(cell.test_options)
        record['inputs'].update({f'test:{key}': dict(path=path, digest=file_digest(path, root))
                                 for key, path in input_files(test_cfg).items() if key.startswith('test_')})
    return record


def fingerprint_path(cell):
    return osp.join(cell.work_dir, FINGERPRINT_FILE)


def source_commit(root):
    """The git commit of the checkout at ``root`` ('+changes' when tracked files differ from it), or None
    outside a git checkout: recorded beside a fingerprint, not part of it (a commit that only changes the docs
    makes the same cells), so that suite.md can say which code its cells ran. Read for every cell: a run that
    lasts hours may see the checkout move on between its cells."""
    def git(*args):
        return subprocess.run(['git', '-C', root, *args], capture_output=True, text=True)
    head = git('rev-parse', '--short=12', 'HEAD')
    if head.returncode != 0:
        return None
    changed = git('status', '--porcelain', '--untracked-files=no').stdout.strip()
    return head.stdout.strip() + ('+changes' if changed else '')


def write_fingerprint(cell, record, commit=None, wall_s=None, cpu=None, checkpoint_sha256=None):
    """Record the cell's fingerprint in its work dir, and beside it the commit its commands run, the seconds its
    train and test commands have taken so far, the kind of CPU they run on (model and vector instructions; None:
    not known) and the SHA-256 of the checkpoint it was tested with (None until a test of it has ended on its own,
    whatever its exit code: a test that failed names it too). The CPU is not part of the fingerprint, but a cell
    reruns bit-identically only on the same kind (docs/en/studies/repeatability.md); the checkpoint's digest lets
    that be checked."""
    os.makedirs(cell.work_dir, exist_ok=True)
    write_whole_text(fingerprint_path(cell), json.dumps({FORMAT_KEY: RECORD_FORMAT, 'variant': cell.variant,
                                                         'config_file': cell.config, 'commit': commit,
                                                         'wall_s': wall_s, 'cpu': cpu,
                                                         'checkpoint_sha256': checkpoint_sha256, **record},
                                                        indent=1))  # never a half-written record


def with_hook_names(value):
    """A recorded config with every hook type that RENAMED_HOOKS maps replaced by the name it maps to."""
    if isinstance(value, dict):
        return {key: RENAMED_HOOKS.get(item, item) if key == 'type' and isinstance(item, str)
                else with_hook_names(item) for key, item in value.items()}
    if isinstance(value, list):
        return [with_hook_names(item) for item in value]
    return value


def current_format(record, path):
    """A record of any format (the module docstring) in the current one, its FORMAT_KEY kept; raises
    :class:`~condtok_mm.suites.results.UnreadableCellFile` naming a format this condtok_mm does not read, or a record
    that lacks a key its format has."""
    record_format = record.get(FORMAT_KEY, 1)
    if not is_integer(record_format) or not 1 <= record_format <= RECORD_FORMAT:
        raise UnreadableCellFile(f'{path} is a record of format {record_format!r}; this condtok_mm reads formats 1 '
                                 f'to {RECORD_FORMAT}: gather the cell with the condtok_mm that wrote it, or set it '
                                 'aside (move its work dir away) to run it again')
    if record_format == 1:
        current = {key: None for key in FINGERPRINT_KEYS + RECORD_KEYS}
        current.update(record)
        current.update({FORMAT_KEY: 1, 'config': with_hook_names(record.get('config'))})
        return current
    missing = [key for key in FINGERPRINT_KEYS + RECORD_KEYS if key not in record]
    if missing:
        raise UnreadableCellFile(f'{path} is a record of format {record_format} without {", ".join(missing)}: set '
                                 'the cell aside (move its work dir away) to run it again')
    return record


def cell_record(cell):
    """The cell's suite_cell.json in the current format (:func:`current_format`), or None where it has none; raises
    :class:`~condtok_mm.suites.results.UnreadableCellFile` naming a record that cannot be parsed, is not a JSON
    object or is not a record of a format this condtok_mm reads."""
    path = fingerprint_path(cell)
    if not osp.isfile(path):
        return None
    record = read_json(path)
    if not isinstance(record, dict):
        raise UnreadableCellFile(f'{path} holds {json.dumps(record)[:60]}, not the record of a cell (a JSON '
                                 'object): set the cell aside (move its work dir away) to run it again')
    return current_format(record, path)


def recorded_fingerprint(cell):
    """The fingerprint the cell's work dir records, or None where it records none."""
    record = cell_record(cell)
    if record is None:
        return None
    return {key: record[key] for key in FINGERPRINT_KEYS + ((HELD_OUT_KEY, ) if HELD_OUT_KEY in record else ())}


def flatten(value, prefix=''):
    """{dotted key: leaf} of nested dicts (lists are leaves, as --cfg-options sets them; an empty dict below the
    top is a leaf)."""
    if isinstance(value, dict) and (value or not prefix):
        items = {}
        for key, item in value.items():
            items.update(flatten(item, f'{prefix}{key}.'))
        return items
    return {prefix[:-1]: value}


def differences(recorded, current):
    """What differs between two fingerprints, one line each (the config by key, at most SHOWN_CONFIG_KEYS)."""
    lines = []
    old, new = flatten(recorded['config'] or {}), flatten(current['config'])
    changed = sorted((key for key in set(old) | set(new) if old.get(key, '<absent>') != new.get(key, '<absent>')),
                     key=lambda key: (key.count('.'), key))  # model.backbone.type before its arguments
    for key in changed[:SHOWN_CONFIG_KEYS]:
        lines.append(f'config {key}: {old.get(key, "<absent>")!r} recorded, {new.get(key, "<absent>")!r} now')
    if len(changed) > SHOWN_CONFIG_KEYS:
        lines.append(f'config: {len(changed) - SHOWN_CONFIG_KEYS} more keys differ')
    recorded_options, options = recorded['options'] or [], current['options']
    removed = [option for option in recorded_options if option not in options]
    added = [option for option in options if option not in recorded_options]
    if removed or added:
        lines.append('options: ' + ', '.join([f'-{option}' for option in removed] + [f'+{option}' for option in added]))
    elif recorded_options != options:
        lines.append('options: the same options in another order (the last of a key wins)')
    for key in ('seed', 'lr', 'version'):
        if recorded[key] != current[key]:
            lines.append(f'{key}: {recorded[key]!r} recorded, {current[key]!r} now')
    if recorded.get(HELD_OUT_KEY) != current.get(HELD_OUT_KEY):
        lines.append(f'test options: {recorded.get(HELD_OUT_KEY)!r} recorded, {current.get(HELD_OUT_KEY)!r} now')
    if recorded['inputs'] is None:  # only a format-1 record has none
        lines.append('inputs: not recorded (its record, of format 1, holds no digests of the files it read: gather '
                     'or resume it with the commit it ran at, or --rerun-changed)')
    else:
        old_inputs, new_inputs = recorded['inputs'], current['inputs']
        for key in sorted(set(old_inputs) | set(new_inputs)):
            was, now = old_inputs.get(key) or {}, new_inputs.get(key) or {}
            url = str(now.get('path') or was.get('path') or '').startswith(('http://', 'https://'))
            if url and (was.get('digest') is None or now.get('digest') is None):
                continue  # a URL not fetched now or when recorded (or not hashed, format 1): not known to differ
            if was.get('digest') != now.get('digest'):
                lines.append(f'input {key}: {was.get("digest") or "<none>"} recorded, '
                             f'{now.get("digest") or "<none>"} now ({now.get("path") or was["path"]})')
    return lines


def set_aside(cell):
    """Move a changed cell's work dir out of the way (to WORK_DIR.changed-N); returns where it went."""
    n = 1
    while osp.exists(f'{cell.work_dir}.changed-{n}'):
        n += 1
    os.rename(cell.work_dir, f'{cell.work_dir}.changed-{n}')
    return f'{cell.work_dir}.changed-{n}'
