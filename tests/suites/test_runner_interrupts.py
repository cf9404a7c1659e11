"""An interrupt (Ctrl-C, or SIGTERM, which the runner turns into one) at any phase of tools/suites/run_suite.py ends it
with exit code 130 and what to do next, not a traceback; the report's files are each replaced whole, so one that
the interrupt catches being written is still its previous version. The interrupt is raised by the runner's own
calls (monkeypatched), in its own process; test_run_suite_processes.py sends a real SIGINT while a cell trains."""
import json

import matplotlib.figure
import pytest

from condtok_mm.suites import report
from helpers.suite_runs import (BASELINE, CONDITIONED, record_fingerprints, run_runner, run_suite, write_cell,
                                write_suite)


@pytest.fixture
def finished(tmp_path):
    """(suite file, out dir) of a suite whose four cells are finished."""
    out_dir = tmp_path / 'out'
    for variant, seed, bbox in (('baseline', 0, 0.1), ('baseline', 1, 0.2), ('cond', 0, 0.3), ('cond', 1, 0.4)):
        write_cell(str(out_dir), variant, 1e-3, seed, bbox, 0.05, [3.0, 2.0, 1.0])
    suite = write_suite(tmp_path / 's.py', dict(baseline=dict(config=BASELINE), cond=dict(config=CONDITIONED)),
                        lrs=(1e-3, ))
    record_fingerprints(suite, out_dir)
    return suite, out_dir


def interrupt(*args, **kwargs):
    raise KeyboardInterrupt


def gathered(suite, out_dir):
    """The runner's --gather-only run; an interrupt that escapes it fails the test (not the test session)."""
    try:
        return run_runner(suite, '--out-dir', str(out_dir), '--gather-only')
    except KeyboardInterrupt:
        pytest.fail('the interrupt escaped the runner as a traceback')


@pytest.mark.parametrize('module, call, reporting', [
    (run_suite, 'load_suite', False),  # reading the suite file
    (run_suite, 'run_phases', False),  # the cells
    (run_suite, 'describe_machine', True),
    (run_suite, 'summary_of', True),  # the statistics and tables
    (report, 'markdown', True),  # between suite.json and suite.md
    (run_suite, 'plot', True),
])
def test_an_interrupt_at_each_phase_exits_130_saying_how_to_go_on(finished, monkeypatch, module, call, reporting):
    suite, out_dir = finished
    monkeypatch.setattr(module, call, interrupt)
    result = gathered(suite, out_dir)
    assert result.returncode == 130 and 'Traceback' not in result.stderr
    if reporting:
        assert (f'interrupted while writing the report: the cells are finished, and each of suite.md, suite.json, '
                f'ap_vs_lr.png, seeds.png, loss.png, kappa.png in {out_dir} is whole (its previous version or the new '
                'one); the same command writes them again') in result.stderr
    else:
        assert 'interrupted: the running cells were stopped; the same command with --resume continues them' \
            in result.stderr


def test_suite_json_interrupted_while_it_is_encoded_is_left_as_it_was(finished, monkeypatch):
    suite, out_dir = finished
    assert gathered(suite, out_dir).returncode == 0
    before = {path.name: path.read_bytes() for path in out_dir.iterdir() if path.is_file()}
    encode = json.JSONEncoder.iterencode

    def cut_short(self, value, *args, **kwargs):  # the summary's first chunks, then the interrupt
        chunks = encode(self, value, *args, **kwargs)
        if isinstance(value, dict) and 'cells_detail' in value:
            yield from (next(chunks) for _ in range(20))
            raise KeyboardInterrupt
        yield from chunks

    monkeypatch.setattr(json.JSONEncoder, 'iterencode', cut_short)
    assert gathered(suite, out_dir).returncode == 130
    monkeypatch.undo()
    assert {path.name: path.read_bytes() for path in out_dir.iterdir() if path.is_file()} == before
    json.loads((out_dir / 'suite.json').read_text())


def test_a_figure_interrupted_while_it_is_saved_is_left_as_it_was(finished, monkeypatch):
    suite, out_dir = finished
    assert gathered(suite, out_dir).returncode == 0
    figure = (out_dir / 'ap_vs_lr.png').read_bytes()
    assert figure.startswith(b'\x89PNG')

    def cut_short(self, path, *args, **kwargs):
        with open(path, 'wb') as f:
            f.write(figure[:100])
        raise KeyboardInterrupt

    monkeypatch.setattr(matplotlib.figure.Figure, 'savefig', cut_short)
    assert gathered(suite, out_dir).returncode == 130
    assert (out_dir / 'ap_vs_lr.png').read_bytes() == figure
    assert sorted(path.name for path in out_dir.iterdir() if path.is_file()) == sorted(report.REPORT_FILES)
