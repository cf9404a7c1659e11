"""What a cell's files say: how far it got, its test metrics, its loss and kappa curves (mmengine's logs)."""
import glob
import json
import math
import os.path as osp

LOG_TAIL_LINES = 25
# kappa curves drawn from the AttentionConditioningHook's records, where a config has the hook: the tokens
# entering the first block, and the first attention's input (what it multiplies).
KAPPA_CURVES = {
    'kappa/tokens_out_mean/stage0': 'tokens entering the first block',
    'kappa/attn_input_mean/stage0': "the first attention's input (norm1 output, per window)",
}


def newest(pattern):
    files = sorted(glob.glob(pattern))
    return files[-1] if files else None


def evaluation(cell):
    """The metrics tools/test.py logged for the cell (mmengine's <timestamp>.json of the newest test run)."""
    path = newest(osp.join(cell.work_dir, 'test', '*', '*.json'))
    if path is None:
        return None
    with open(path) as f:
        record = json.load(f)  # mmengine's LoggerHook dumps the test epoch's tags as one JSON object
    return (path, record) if any(key.startswith('coco/') for key in record) else None


def cell_state(cell):
    """'finished' (evaluated), 'trained' (final checkpoint, no evaluation), 'interrupted' (a checkpoint to resume
    from) or 'new'."""
    if evaluation(cell):
        return 'finished'
    if osp.isfile(cell.checkpoint):
        return 'trained'
    if osp.isfile(osp.join(cell.work_dir, 'last_checkpoint')):
        return 'interrupted'
    return 'new'


def log_tail(path):
    if not osp.isfile(path):
        return '(no log)'
    with open(path, errors='replace') as f:
        return ''.join(f.readlines()[-LOG_TAIL_LINES:])


def training_record(work_dir):
    """(path, iterations, losses, {kappa key: curve}) of the newest training run's vis_data/scalars.json
    (mmengine's LocalVisBackend: one JSON record a line; the hook's kappa records carry their iteration as
    'step')."""
    path = newest(osp.join(work_dir, '2*', 'vis_data', 'scalars.json'))
    iters, losses, kappa = [], [], {key: dict(iter=[], value=[]) for key in KAPPA_CURVES}
    validation = {}
    if path:
        with open(path) as f:
            for line in f:
                record = json.loads(line)
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
    return path, iters, losses, kappa, validation


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


def cell_results(cell, rule):
    """Metrics (percent), final loss, loss, kappa and validation curves, plateau escape (under the
    :class:`~condtok_mm.benchmark.schema.EscapeRule` ``rule``) and divergence of a cell."""
    found = evaluation(cell)
    scalars, iters, losses, kappa, validation = training_record(cell.work_dir)
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
