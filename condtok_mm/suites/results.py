"""What a cell's files say: how far it got, its test metrics, its loss and kappa curves (mmengine's logs)."""
import glob
import json
import math
import os.path as osp

LOG_TAIL_LINES = 25
# kappa curves drawn from the AttentionKappaHook's records, where a config has the hook: the tokens
# entering the first block, and the first attention's input (what it multiplies).
KAPPA_CURVES = {
    'kappa/tokens_out_mean/stage0': 'tokens entering the first block',
    'kappa/attn_input_mean/stage0': "the first attention's input (norm1 output, per window)",
}


class UnreadableCellFile(ValueError):
    """A cell file that cannot be parsed (mmengine writes neither its JSON nor its scalars atomically: a kill or a
    full disk leaves one cut off); the message names the file and the fix."""


def newest(pattern):
    files = sorted(glob.glob(pattern))
    return files[-1] if files else None


def read_json(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError) as error:
        raise UnreadableCellFile(f'{path} is cut off or unreadable ({error}); delete it to test the cell again '
                                 '(run_suite.py --resume)') from error


def is_number(value):
    """Whether a JSON value is a number (JSON's true and false read back as bools, which are ints)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def is_integer(value):
    return isinstance(value, int) and not isinstance(value, bool)


def evaluation(cell):
    """The metrics tools/test.py logged for the cell (mmengine's <timestamp>.json of the newest test run); raises
    :class:`UnreadableCellFile` where that file cannot be parsed or holds a metric that is not finite (an AP is
    in [0, 1], or -1 where COCO has nothing to score)."""
    path = newest(osp.join(cell.work_dir, 'test', '*', '*.json'))
    if path is None:
        return None
    record = read_json(path)  # mmengine's LoggerHook dumps the test epoch's tags as one JSON object
    if not (isinstance(record, dict) and any(key.startswith('coco/') for key in record)):
        return None
    for key, value in record.items():
        if key.startswith('coco/') and is_number(value) and not math.isfinite(value):
            raise UnreadableCellFile(f'{path} holds {key} = {value}, which no evaluation gives; delete it to test '
                                     'the cell again (run_suite.py --resume)')
    return path, record


def cell_state(cell):
    """'finished' (evaluated), 'trained' (final checkpoint, no readable evaluation), 'interrupted' (a checkpoint to
    resume from) or 'new'."""
    try:
        if evaluation(cell):
            return 'finished'
    except UnreadableCellFile:
        pass  # a cut-off evaluation: the cell is tested again (cell_results names the file)
    if osp.isfile(cell.checkpoint):
        return 'trained'
    if osp.isfile(osp.join(cell.work_dir, 'last_checkpoint')):
        return 'interrupted'
    return 'new'


def diverged_untestable(results, record):
    """Whether a cell without a test result is one whose loss diverged and that its test could not score: a loss
    it logged is not finite (``results``: :func:`cell_results`'s) and its record (its suite_cell.json, a dict, or
    None) holds the SHA-256 of its final checkpoint, which the runner writes once a test of that checkpoint has
    ended on its own, whatever its exit code. A test the runner stopped or never started leaves None, and so does
    a training that has not ended (no final checkpoint to hash), so neither counts: --resume runs what is left."""
    return bool(results.get('diverged')) and bool((record or {}).get('checkpoint_sha256'))


def log_tail(path):
    if not osp.isfile(path):
        return '(no log)'
    with open(path, errors='replace') as f:
        return ''.join(f.readlines()[-LOG_TAIL_LINES:])


def training_runs(work_dir):
    """Every training run's vis_data/scalars.json in ``work_dir``, oldest first: mmengine starts a new timestamped
    folder each time a run starts or resumes."""
    return sorted(glob.glob(osp.join(work_dir, '2*', 'vis_data', 'scalars.json')))


def record_problem(record):
    """What in a scalars record (a dict) the curves cannot use, or None: positions ('iter', 'epoch', 'step') that
    are not integers, a training loss that is not a number (a non-finite one is a divergence, and is kept), a
    kappa that is not a number, a kappa or validation record without its 'step', a validation AP that is not
    finite."""
    for key in ('iter', 'epoch', 'step'):
        if key in record and not is_integer(record[key]):
            return f'its {key} is {record[key]!r}, not an integer'
    if 'iter' in record and 'loss' in record and not is_number(record['loss']):
        return f'its loss is {record["loss"]!r}, not a number'
    for key, value in record.items():
        kappa, validation = key in KAPPA_CURVES, key.startswith('coco/') and is_number(value)
        if kappa and not is_number(value):
            return f'its {key} is {value!r}, not a number'
        if validation and not math.isfinite(value):
            return f'its {key} is {value}, which no evaluation gives'
        if (kappa or validation) and 'step' not in record:
            return f'it has {key} without the step it was recorded at'
    return None


def scalar_records(path, followed=False):
    """The records of one scalars.json (one JSON object a line); raises :class:`UnreadableCellFile` naming the
    file and line where one cannot be parsed or holds what the curves cannot use (:func:`record_problem`), except
    a last line that cannot be parsed in a run that a later run ``followed``: a stop mid-write cuts that one, and
    the resumed run logs its position anew."""
    records = []
    try:
        with open(path) as f:
            lines = f.readlines()
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except ValueError as error:
                if followed and number == len(lines):
                    continue
                raise UnreadableCellFile(
                    f'{path} line {number} is cut off or unreadable ({error}); delete that line where the '
                    'run went on after it, or set the cell aside to train it again') from error
            if not isinstance(record, dict):
                continue
            problem = record_problem(record)
            if problem:
                raise UnreadableCellFile(f'{path} line {number} is corrupt: {problem}; delete that line where the '
                                         'run went on after it, or set the cell aside to train it again')
            records.append(record)
    except (OSError, UnicodeDecodeError) as error:
        raise UnreadableCellFile(f'{path} cannot be read ({error})') from error
    return records


def record_stream(record):
    """(stream, position) of a scalars record: a training log by its iteration, a validation by its epoch (its
    'step'), a hook's record by its iteration (its 'step')."""
    if 'iter' in record:
        return 'train', record['iter']
    if any(key.startswith('coco/') for key in record):
        return 'val', record.get('step')
    return 'hook', record.get('step')


def joined_records(paths):
    """The records of a cell's training runs (oldest first) as one uninterrupted run would have logged them.

    A resumed run starts again from its checkpoint and logs everything after it anew, at the positions an
    uninterrupted run logs (each stream's positions depend on the iteration alone). So each run replaces, in
    the records of the runs before it, every training log and hook record from its own first one of that stream
    on, and every validation from the first epoch it trains."""
    joined = []
    for i, path in enumerate(paths):
        records = scalar_records(path, followed=i < len(paths) - 1)
        first = {}
        for record in records:
            stream, position = record_stream(record)
            if position is not None:
                first.setdefault(stream, position)
        epochs = [record['epoch'] for record in records if 'iter' in record and 'epoch' in record]
        if epochs:
            first['val'] = min(first.get('val', epochs[0]), epochs[0])

        def superseded(record):
            stream, position = record_stream(record)
            return stream in first and position is not None and position >= first[stream]

        joined = [record for record in joined if not superseded(record)] + records
    return joined


def training_record(work_dir):
    """(paths, iterations, losses, {kappa key: curve}, validations) of the cell's training runs joined in
    iteration order (:func:`joined_records`; mmengine's LocalVisBackend: one JSON record a line; the hook's kappa
    records carry their iteration as 'step', a validation its epoch)."""
    paths = training_runs(work_dir)
    iters, losses, kappa = [], [], {key: dict(iter=[], value=[]) for key in KAPPA_CURVES}
    validation = {}
    for record in joined_records(paths):
        if 'loss' in record and 'iter' in record:
            iters.append(record['iter'])
            losses.append(record['loss'])
        for key in KAPPA_CURVES:
            if key in record:
                kappa[key]['iter'].append(record['step'])
                kappa[key]['value'].append(record[key])
        for key, value in record.items():  # a validation during training: its epoch as 'step'
            if key.startswith('coco/') and isinstance(value, (int, float)):
                validation.setdefault(key, dict(epoch=[], value=[]))
                validation[key]['epoch'].append(record['step'])
                validation[key]['value'].append(100 * value)
    return paths, iters, losses, kappa, validation


def escape_iteration(iters, losses, warmup, rule):
    """When the run left its initial loss plateau: (iteration or None, plateau level, threshold).

    The plateau level is the mean of the first ``rule.window`` losses logged at or after the warm-up's end
    (``rule.after``, else ``warmup``): where training settles once the rate has reached its peak. The run
    escapes at the first later logged iteration where the loss, smoothed by a trailing mean over
    ``rule.window`` logged values (mmengine already logs the mean over each logging interval), is at most
    (1 - ``rule.margin``) x that level. (None, None, None) without a finite logged loss after the warm-up."""
    after = warmup if rule.after is None else rule.after
    start = next((i for i, it in enumerate(iters) if it >= after), None)
    if start is None:
        return None, None, None
    settled = losses[start:start + rule.window]
    plateau = sum(settled) / len(settled)
    if not math.isfinite(plateau):
        return None, None, None
    threshold = (1 - rule.margin) * plateau
    for i in range(start + 1, len(iters)):
        trailing = losses[max(0, i - rule.window + 1):i + 1]
        if sum(trailing) / len(trailing) <= threshold:
            return iters[i], plateau, threshold
    return None, plateau, threshold


def unreadable_results(reason):
    """The results of a cell with a file that cannot be used: ``reason`` (the file and the fix), no metrics and
    empty curves, so that no table or figure reads it."""
    return dict(unreadable=reason, scalars=[], loss=dict(iter=[], value=[]),
                kappa={key: dict(iter=[], value=[]) for key in KAPPA_CURVES}, validation={}, diverged=False)


def cell_results(cell, rule):
    """Metrics (percent), final loss, loss, kappa and validation curves, plateau escape (under the
    :class:`~condtok_mm.suites.schema.EscapeRule` ``rule``) and divergence of a cell; a cell with a file that
    cannot be parsed gets 'unreadable' (the file and the fix) and no metrics, so that no table reads it."""
    try:
        found = evaluation(cell)
        scalars, iters, losses, kappa, validation = training_record(cell.work_dir)
    except UnreadableCellFile as error:
        return unreadable_results(str(error))
    results = dict(scalars=scalars, loss=dict(iter=iters, value=losses), kappa=kappa, validation=validation,
                   diverged=any(not math.isfinite(loss) for loss in losses))
    if cell.status == 'failed':
        tail = log_tail(cell.log or osp.join(cell.work_dir, 'train.log')).lower()
        results['diverged'] = results['diverged'] or 'non-finite' in tail or 'nan' in tail.split()
    if found:
        path, record = found
        results.update(evaluation=path, metrics={key: 100 * value for key, value in record.items()
                                                 if key.startswith('coco/') and isinstance(value, (int, float))})
    if losses:
        iteration, plateau, threshold = escape_iteration(iters, losses, cell.warmup, rule)
        results.update(final_loss=losses[-1], escape=dict(iteration=iteration, plateau=plateau, threshold=threshold))
    return results
