"""What the suite runner reads of a cell across interruptions and faults: a cell resumed any number of times reports
the curves of one uninterrupted run, a cut-off cell file marks that cell unfinished and names the file while the
others are gathered, and a suite whose seeds or rates would give two runs one work dir is refused at load."""
import argparse
import hashlib
import json

import pytest

from condtok_mm.suites import launch
from condtok_mm.suites.plan import Cell
from condtok_mm.suites.results import UnreadableCellFile, cell_results, joined_records, training_record
from condtok_mm.suites.schema import EscapeRule, SuiteError, load_suite
from helpers.repo import REPO_ROOT
from helpers.suite_runs import BASELINE, CONDITIONED, record_fingerprints, run_runner, write_cell, write_suite

ITERS_PER_EPOCH = 50


def uninterrupted_records(epochs=4, log_every=10, hook_every=50, value=1.0):
    """The scalars an uninterrupted run logs: a training record every ``log_every`` iterations, a hook record at
    iteration 1 and every ``hook_every``, a validation after each epoch; every value offset by ``value``."""
    records = []
    for iteration in range(1, epochs * ITERS_PER_EPOCH + 1):
        epoch = (iteration - 1) // ITERS_PER_EPOCH + 1
        if iteration == 1 or iteration % hook_every == 0:
            records.append({'kappa/tokens_out_mean/stage0': value + iteration, 'step': iteration})
        if iteration % log_every == 0:
            records.append(dict(lr=1e-3, loss=value + 1 / iteration, iter=iteration, epoch=epoch, step=iteration))
        if iteration % ITERS_PER_EPOCH == 0:
            records.append({'coco/bbox_mAP': value / 10 + epoch / 100, 'step': epoch})
    return records


def write_runs(work_dir, runs):
    """Each run's records into its own timestamped vis_data/scalars.json, as mmengine writes a run and each resume."""
    for i, records in enumerate(runs):
        folder = work_dir / f'2026010{i + 1}_000000' / 'vis_data'
        folder.mkdir(parents=True)
        (folder / 'scalars.json').write_text(''.join(json.dumps(record) + '\n' for record in records))


def at(record):
    """The iteration a record stands at (a validation: the end of its epoch)."""
    if any(key.startswith('coco/') for key in record):
        return record['step'] * ITERS_PER_EPOCH
    return record.get('iter', record.get('step'))


def between(records, first, last):
    return [record for record in records if first <= at(record) <= last]


def test_a_cell_resumed_twice_reports_the_curves_of_one_uninterrupted_run(tmp_path):
    # killed at iteration 130 (after its epoch-2 checkpoint), resumed from epoch 2; killed again at 185 (after its
    # epoch-3 checkpoint and validation), resumed from epoch 3. Each resume logs everything after its checkpoint
    # anew (here with other values, so that a stale record would show).
    logged = {value: uninterrupted_records(value=value) for value in (1.0, 2.0, 3.0)}
    end = 4 * ITERS_PER_EPOCH
    write_runs(tmp_path, [between(logged[1.0], 1, 130), between(logged[2.0], 101, 185),
                          between(logged[3.0], 151, end)])
    expected = between(logged[1.0], 1, 100) + between(logged[2.0], 101, 150) + between(logged[3.0], 151, end)
    paths = sorted(str(path) for path in tmp_path.glob('2*/vis_data/scalars.json'))
    order = lambda record: (at(record), sorted(record))  # noqa: E731
    assert sorted(joined_records(paths), key=order) == sorted(expected, key=order)
    _, iters, losses, kappa, validation = training_record(str(tmp_path))
    assert iters == list(range(10, end + 1, 10))  # every logged iteration once, in order
    assert losses[:10] == [1.0 + 1 / i for i in range(10, 101, 10)]  # the first run's part is kept
    assert losses[-1] == 3.0 + 1 / end
    assert kappa['kappa/tokens_out_mean/stage0']['iter'] == [1, 50, 100, 150, 200]
    assert kappa['kappa/tokens_out_mean/stage0']['value'] == [2.0, 51.0, 101.0, 152.0, 203.0]
    assert validation['coco/bbox_mAP']['epoch'] == [1, 2, 3, 4]
    assert validation['coco/bbox_mAP']['value'] == pytest.approx([11, 12, 23, 34])


def test_a_resumed_cells_loss_curve_is_whole_in_the_gathered_suite(tmp_path):
    out_dir = tmp_path / 'out'
    write_cell(str(out_dir), 'baseline', 1e-3, 0, 0.1, 0.05, [3.0, 2.0, 1.0])
    work_dir = out_dir / 'baseline' / 'lr0.001' / 'seed0'
    later = work_dir / '20260102_000000' / 'vis_data'  # a resume after the first 20 iterations
    later.mkdir(parents=True)
    (later / 'scalars.json').write_text(''.join(json.dumps(dict(loss=loss, iter=it, epoch=1, step=it)) + '\n'
                                                for loss, it in ((1.5, 30), (0.5, 40))))
    suite = write_suite(tmp_path / 's.py', dict(baseline=dict(config=BASELINE)), seeds=(0, ), lrs=(1e-3, ))
    record_fingerprints(suite, out_dir)
    result = run_runner(suite, '--out-dir', str(out_dir), '--gather-only')
    assert result.returncode == 0, result.stderr[-3000:]
    loss = json.loads((out_dir / 'suite.json').read_text())['cells_detail'][0]['results']['loss']
    assert loss == dict(iter=[10, 20, 30, 40], value=[3.0, 2.0, 1.5, 0.5])


def cut_off(path):
    text = path.read_text()
    path.write_text(text[:len(text) // 2])


@pytest.mark.parametrize('which', ['test', 'scalars'])
def test_a_cut_off_cell_file_marks_that_cell_unfinished_naming_it_and_the_others_are_gathered(tmp_path, which):
    out_dir = tmp_path / 'out'
    for variant, seed, bbox in (('baseline', 0, 0.1), ('baseline', 1, 0.2), ('cond', 0, 0.3), ('cond', 1, 0.4)):
        write_cell(str(out_dir), variant, 1e-3, seed, bbox, 0.05, [3.0, 2.0, 1.0])
    suite = write_suite(tmp_path / 's.py', dict(baseline=dict(config=BASELINE), cond=dict(config=CONDITIONED)),
                        lrs=(1e-3, ))
    record_fingerprints(suite, out_dir)
    work_dir = out_dir / 'cond' / 'lr0.001' / 'seed1'
    broken = next(work_dir.glob('test/*/*.json' if which == 'test' else '2*/vis_data/scalars.json'))
    cut_off(broken)
    result = run_runner(suite, '--out-dir', str(out_dir), '--gather-only')
    assert result.returncode == 1
    assert f'cond lr 0.001 seed 1: {broken}' in result.stderr and 'cut off or unreadable' in result.stderr
    assert 'error: 1 of 4 cells did not finish: cond lr 0.001 seed 1 (unreadable, ' in result.stderr
    summary = json.loads((out_dir / 'suite.json').read_text())
    status = {(c['variant'], c['seed']): c['status'] for c in summary['cells_detail']}
    assert status == {('baseline', 0): 'reused', ('baseline', 1): 'reused', ('cond', 0): 'reused',
                      ('cond', 1): 'unreadable'}
    cond = next(row for row in summary['rows'] if row['variant'] == 'cond')
    assert cond['seeds'] == [0]  # the cut-off cell is in no table


def appended(record):
    """A change that writes ``record`` as the file's last line."""
    return lambda path: path.write_text(path.read_text() + json.dumps(record) + '\n')


def replaced(text):
    return lambda path: path.write_text(text)


def updated(**keys):
    """A change that sets ``keys`` in the file's JSON object."""
    return lambda path: path.write_text(json.dumps(dict(json.loads(path.read_text()), **keys)))


# corrupt but parseable records: (the file of the cell, the change, what the message says after the file's name)
CORRUPT = {
    'a NaN test metric': ('test', replaced('{"coco/bbox_mAP": NaN, "coco/segm_mAP": 0.1}'),
                          'holds coco/bbox_mAP = nan, which no evaluation gives; delete it to test the cell'),
    'an infinite validation AP': ('scalars', appended({'coco/bbox_mAP': float('inf'), 'step': 1}),
                                  'line 4 is corrupt: its coco/bbox_mAP is inf'),
    'a string loss': ('scalars', appended(dict(loss='0.5', iter=40, epoch=1, step=40)),
                      "line 4 is corrupt: its loss is '0.5', not a number"),
    'a null loss': ('scalars', appended(dict(loss=None, iter=40, epoch=1, step=40)),
                    'line 4 is corrupt: its loss is None, not a number'),
    'an iteration that is not an integer': ('scalars', appended(dict(loss=0.5, iter='40', epoch=1, step=40)),
                                            "line 4 is corrupt: its iter is '40', not an integer"),
    'a kappa without its step': ('scalars', appended({'kappa/tokens_out_mean/stage0': 3.0}), 'line 4 is corrupt: it '
                                 'has kappa/tokens_out_mean/stage0 without the step it was recorded at'),
    'a validation without its step': ('scalars', appended({'coco/bbox_mAP': 0.3}),
                                      'line 4 is corrupt: it has coco/bbox_mAP without the step'),
    'a suite_cell.json that is not an object': ('record', replaced('[1, 2]'),
                                                'holds [1, 2], not the record of a cell (a JSON object)'),
    'a suite_cell.json of a format this package does not read': (
        'record', updated(record_format=99),
        'is a record of format 99; this condtok_mm reads formats 1 to 2: gather the cell with the condtok_mm that '
        'wrote it'),
}


@pytest.mark.parametrize('corruption', sorted(CORRUPT))
def test_a_corrupt_but_parseable_cell_record_marks_that_cell_unreadable_naming_it(tmp_path, corruption):
    out_dir = tmp_path / 'out'
    for variant, seed, bbox in (('baseline', 0, 0.1), ('baseline', 1, 0.2), ('cond', 0, 0.3), ('cond', 1, 0.4)):
        write_cell(str(out_dir), variant, 1e-3, seed, bbox, 0.05, [3.0, 2.0, 1.0])
    suite = write_suite(tmp_path / 's.py', dict(baseline=dict(config=BASELINE), cond=dict(config=CONDITIONED)),
                        lrs=(1e-3, ))
    record_fingerprints(suite, out_dir)
    work_dir = out_dir / 'cond' / 'lr0.001' / 'seed1'
    files = dict(test=next(work_dir.glob('test/*/*.json')), scalars=next(work_dir.glob('2*/vis_data/scalars.json')),
                 record=work_dir / 'suite_cell.json')
    where, change, message = CORRUPT[corruption]
    change(files[where])
    result = run_runner(suite, '--out-dir', str(out_dir), '--gather-only')
    assert result.returncode == 1 and 'Traceback' not in result.stderr
    assert f'cond lr 0.001 seed 1: {files[where]} {message}' in result.stderr
    assert 'error: 1 of 4 cells did not finish: cond lr 0.001 seed 1 (unreadable, ' in result.stderr
    summary = json.loads((out_dir / 'suite.json').read_text())
    status = {(c['variant'], c['seed']): c['status'] for c in summary['cells_detail']}
    assert status == {('baseline', 0): 'reused', ('baseline', 1): 'reused', ('cond', 0): 'reused',
                      ('cond', 1): 'unreadable'}
    cond = next(row for row in summary['rows'] if row['variant'] == 'cond')
    assert cond['seeds'] == [0] and cond['metrics']['coco/bbox_mAP']['values'] == [30.0]  # in no table


def test_a_cell_whose_fresh_test_logs_a_nan_metric_is_gathered_as_unreadable(tmp_path, monkeypatch):
    """run_cell with commands that leave the files mmengine would: the test's JSON holds a NaN AP; the runner goes
    on to the other cells instead of stopping."""
    work_dir = tmp_path / 'v' / 'lr0.001' / 'seed0'
    cell = Cell(variant='v', lr=1e-3, seed=0, work_dir=str(work_dir), config=BASELINE, config_path=BASELINE,
                checkpoint=str(work_dir / 'epoch_12.pth'), fingerprint=dict(config={}, seed=0, lr=1e-3))
    outputs = [{'epoch_12.pth': ''}, {'test/1/1.json': '{"coco/bbox_mAP": NaN}'}]  # of the train and test commands

    def run_logged(children, command, log_path, env, root):
        for name, text in outputs.pop(0).items():
            (work_dir / name).parent.mkdir(parents=True, exist_ok=True)
            (work_dir / name).write_text(text)
        return 0

    monkeypatch.setattr(launch, 'run_logged', run_logged)
    args = argparse.Namespace(launcher='none', jobs=1, nproc=1, partition=None)
    assert launch.run_cell(cell, args, 0, REPO_ROOT, launch.Children()).status == 'ran'
    results = cell_results(cell, EscapeRule())
    assert results['unreadable'].startswith(f'{work_dir}/test/1/1.json holds coco/bbox_mAP = nan')
    assert 'metrics' not in results


@pytest.mark.parametrize('train_code, test_code, stopped, recorded', [
    (0, 0, False, True), (0, 1, False, True), (0, -2, True, False), (1, None, False, False)],
    ids=['tested', 'test-failed', 'test-stopped', 'training-failed'])
def test_the_record_names_the_final_checkpoint_once_a_test_of_it_ended_whatever_its_exit_code(
        tmp_path, monkeypatch, train_code, test_code, stopped, recorded):
    """run_cell with commands standing in for the tools: the SHA-256 of the final checkpoint is recorded once the
    test command ended on its own, passed or failed; a test the runner stopped, or none, records None."""
    work_dir = tmp_path / 'v' / 'lr0.001' / 'seed0'
    cell = Cell(variant='v', lr=1e-3, seed=0, work_dir=str(work_dir), config=BASELINE, config_path=BASELINE,
                checkpoint=str(work_dir / 'epoch_12.pth'), fingerprint=dict(config={}, seed=0, lr=1e-3))
    children = launch.Children()

    def run_logged(children_, command, log_path, env, root):
        if command[1].endswith('train.py'):
            if train_code == 0:
                (work_dir / 'epoch_12.pth').write_bytes(b'final weights')
            return train_code
        if stopped:
            children.stop()  # the runner stopped while the test ran
        return test_code

    monkeypatch.setattr(launch, 'run_logged', run_logged)
    args = argparse.Namespace(launcher='none', jobs=1, nproc=1, partition=None)
    launch.run_cell(cell, args, 0, REPO_ROOT, children)
    record = json.loads((work_dir / 'suite_cell.json').read_text())
    assert record['checkpoint_sha256'] == (hashlib.sha256(b'final weights').hexdigest() if recorded else None)


def test_a_cut_off_scalars_line_is_named_by_file_and_line(tmp_path):
    write_runs(tmp_path, [uninterrupted_records(epochs=1)])
    (path, ) = tmp_path.glob('2*/vis_data/scalars.json')
    with open(path, 'a') as f:
        f.write('{"loss": 0.5, "it')
    lines = len(path.read_text().splitlines())
    with pytest.raises(UnreadableCellFile, match=f'{path} line {lines} is cut off or unreadable'):
        training_record(str(tmp_path))


@pytest.mark.parametrize('extra, message', [
    ('seeds = [3, 3]', r'seeds repeats \[3\]'),
    ('seeds = [3, True]', r'seeds must be a list of integers, got \[3, True\]'),
    ('seeds = [3, 4.0]', r'seeds must be a list of integers'),
    ('selection_seeds = [0, 0]', r'selection_seeds repeats \[0\]'),
    ('lrs = [1e-3, 0.0010000001]', r'lrs has rates that are one cell \(lr0.001'),
    ("lrs = [1e-3, float('inf')]", r'lrs must be .*finite positive rates'),
    ("lrs = [float('nan')]", r'lrs must be .*finite positive rates'),
    ('lrs = [1e-3, -1e-3]', r'lrs must be .*finite positive rates'),
])
def test_seeds_and_rates_that_would_share_a_work_dir_or_are_not_numbers_are_refused_by_name(tmp_path, extra,
                                                                                              message):
    path = write_suite(tmp_path / 's.py', dict(baseline=dict(config=BASELINE)))
    with open(path, 'a') as f:
        f.write(extra + '\n')
    with pytest.raises(SuiteError, match=message):
        load_suite(path, REPO_ROOT)


def test_a_variants_own_colliding_rates_are_refused_naming_the_variant(tmp_path):
    path = write_suite(tmp_path / 's.py', dict(baseline=dict(config=BASELINE, lrs=[2.5e-4, 2.50000001e-4])))
    with pytest.raises(SuiteError, match=r"variant 'baseline' has rates that are one cell \(lr0.00025"):
        load_suite(path, REPO_ROOT)


def test_a_cut_off_last_line_of_a_run_that_a_resume_followed_is_left_out_and_of_the_newest_run_named(tmp_path):
    logged = uninterrupted_records(epochs=2)
    write_runs(tmp_path, [between(logged, 1, 60), between(logged, 51, 100)])
    first, last = sorted(tmp_path.glob('2*/vis_data/scalars.json'))
    with open(first, 'a') as f:
        f.write('{"loss": 0.5, "it')  # the stop cut the interrupted run's last record
    _, iters, _, _, _ = training_record(str(tmp_path))
    assert iters == list(range(10, 101, 10))
    with open(last, 'a') as f:
        f.write('{"loss": 0.5, "it')  # the newest run's cut: nothing after it says what it held
    with pytest.raises(UnreadableCellFile, match=f'{last} line'):
        training_record(str(tmp_path))
