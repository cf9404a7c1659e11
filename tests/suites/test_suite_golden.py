"""The suite runner's gathered table and JSON on written runs, pinned byte for byte (tests/benchmark/golden/):
a refactor of tools/suites/run_suite.py or condtok_mm/suites/ must leave them as they are. Only what
differs between machines and runs is replaced before the comparison: the temporary directory, the machine
description and the wall time.

A deliberate change of the output regenerates the files: CONDTOK_UPDATE_GOLDEN=1 pytest THIS_FILE, then the
diff of tests/benchmark/golden/ shows what changed."""
import json
import os
import os.path as osp
import re

from helpers.suite_runs import BASELINE, CONDITIONED, record_fingerprints, run_runner, write_cell

GOLDEN = osp.join(osp.dirname(osp.abspath(__file__)), 'golden')
FALLING = [4.0, 3.0, 2.5, 2.0, 1.8, 1.5, 1.3, 1.2]
STALLING = [4.0, 3.0, 2.95, 2.9, 2.9, 2.85, 2.8, 2.8]


def written_runs(out_dir):
    """Three variants (one at its source's best rate), two rates, three seeds; one cell stalls, one logged a
    NaN loss, one trained but was never tested."""
    for v, variant in enumerate(('baseline', 'cond')):
        for r, lr in enumerate((1e-3, 2e-3)):
            for seed in (0, 1, 2):
                bbox = 0.013 * (1 + v) * (1 + seed) + 0.021 * r * (2 - seed) + 0.0037 * seed * seed
                losses = STALLING if (variant, lr, seed) == ('baseline', 2e-3, 1) else FALLING
                if (variant, lr, seed) == ('cond', 1e-3, 2):
                    losses = FALLING[:5] + [float('nan')] + FALLING[6:]
                write_cell(out_dir, variant, lr, seed, bbox, 0.7 * bbox + 0.001 * seed, losses,
                           kappa=(30.0 if variant == 'baseline' else 2.0) + lr * 1000)
    best_cond = 2e-3  # cond's mean bbox AP is higher at 2e-3 (its seed-0 and seed-1 cells gain 0.021 r (2 - seed))
    for seed in (0, 1):
        write_cell(out_dir, 'window', best_cond, seed, 0.05 + 0.01 * seed, 0.03, FALLING, kappa=1.5)
    write_cell(out_dir, 'window', best_cond, 2, None, None, FALLING, kappa=1.5)


def normalised(text, tmp_path, summary):
    """The file's text with the temporary directory, the machine and the wall time replaced."""
    text = text.replace(str(tmp_path), '{TMP}')
    machine = summary['machine']
    text = text.replace(f'on {machine["cpu"]} ({machine["usable_cpus"]} usable CPUs)', 'on {MACHINE}')
    text = re.sub(r'wall time [0-9.]+ min', 'wall time {WALL} min', text)
    text = re.sub(r'"wall_s": [^,\n]+', '"wall_s": "{WALL}"', text)
    return re.sub(r'"machine": \{.*?\n \}', '"machine": "{MACHINE}"', text, flags=re.S)


def test_gathered_table_and_json_are_those_pinned(tmp_path):
    out_dir = tmp_path / 'out'
    written_runs(str(out_dir))
    suite = tmp_path / 'golden_suite.py'
    suite.write_text(
        "description = 'Written runs for the golden test.'\nreference = 'baseline'\nseeds = [0, 1, 2]\n"
        "lrs = [1e-3, 2e-3]\ncfg_options = {'train_cfg.max_epochs': 1}\n"
        f"variants = dict(baseline=dict(config={BASELINE!r}, description='no conditioning'),\n"
        f"                cond=dict(config={CONDITIONED!r}),\n"
        f"                window=dict(config={CONDITIONED!r}, lrs=dict(best_of='cond'),\n"
        "                            cfg_options={'model.backbone.conditioning.scope': 'window'}))\n")
    record_fingerprints(suite, out_dir)
    result = run_runner(str(suite), '--out-dir', str(out_dir), '--gather-only')
    # the untested cell is reported missing, and the runner says so in its exit status
    assert result.returncode == 1, result.stdout[-3000:] + result.stderr[-3000:]
    assert 'error: 1 of 15 cells did not finish: window lr 0.002 seed 2 (missing' in result.stderr
    summary = json.loads((out_dir / 'suite.json').read_text())
    for name in ('suite.md', 'suite.json'):
        text = normalised((out_dir / name).read_text(), tmp_path, summary)
        golden = osp.join(GOLDEN, name)
        if os.environ.get('CONDTOK_UPDATE_GOLDEN') == '1':
            os.makedirs(GOLDEN, exist_ok=True)
            with open(golden, 'w') as f:
                f.write(text)
        with open(golden) as f:
            assert text == f.read(), f'{name} differs from {golden}'
    for name in ('ap_vs_lr.png', 'seeds.png', 'loss.png', 'kappa.png'):
        assert (out_dir / name).read_bytes()[:4] == b'\x89PNG'
