"""The report of a suite: the markdown tables (per variant and rate, then each variant's best rate) and the JSON
summary (every cell's values and curves, and the aggregates)."""
import json
import os.path as osp

from .results import PLATEAU_FRACTION
from .statistics import REPORTED_METRICS, reported_metrics

REPORT_FILES = ('suite.md', 'suite.json', 'ap_vs_lr.png', 'loss.png', 'kappa.png')


def fmt(stat, digits=1):
    if stat is None:
        return 'n/a'
    if stat['std'] is None:
        return f'{stat["mean"]:.{digits}f}'
    return f'{stat["mean"]:.{digits}f} ± {stat["std"]:.{digits}f}'


def fmt_difference(difference):
    if difference is None:
        return 'n/a'
    if difference['low'] is None:
        return f'{difference["mean"]:+.1f} (1 seed)'
    return f'{difference["mean"]:+.1f} [{difference["low"]:+.1f}, {difference["high"]:+.1f}]'


def seeds_text(seeds):
    return ', '.join(str(seed) for seed in seeds) if seeds else '-'


def markdown(suite, rows, best, result):
    reference, metric = suite.reference, suite.metric
    keys = reported_metrics(metric)
    names = [REPORTED_METRICS.get(key, key) for key in keys]
    lines = [f'| variant | lr | seeds | {" | ".join(names)} | Δ {names[0]} vs {reference} (same lr) | '
             f'Δ {names[1] if len(names) > 1 else names[0]} vs {reference} | final loss | plateaued | '
             'diverged | failed |',
             '|---|---|---|' + '---|' * len(names) + '---|---|---|---|---|---|']
    for row in rows:
        differences = [fmt_difference(row['difference'].get(key)) if row['variant'] != reference else '—'
                       for key in keys[:2]]
        lines.append(f'| {row["variant"]} | {row["lr"]:g} | {seeds_text(row["seeds"])} | '
                     + ' | '.join(fmt(row['metrics'].get(key)) for key in keys) + ' | '
                     + ' | '.join(differences) + f' | {fmt(row["final_loss"], 3)} | '
                     f'{seeds_text(row["plateaued"])} | {seeds_text(row["diverged"])} | {seeds_text(row["failed"])} |')
    lines += ['', f'Best learning rate of each variant (by mean {REPORTED_METRICS.get(metric, metric)}); Δ: paired '
              f'by seed against {reference} at its own best rate:', '',
              f'| variant | best lr | {" | ".join(names)} | Δ {names[0]} vs {reference} | '
              f'Δ {names[1] if len(names) > 1 else names[0]} vs {reference} | final loss |',
              '|---|---|' + '---|' * len(names) + '---|---|---|']
    for entry in best:
        differences = [fmt_difference(entry['difference'].get(key)) if entry['variant'] != reference else '—'
                       for key in keys[:2]]
        lines.append(f'| {entry["variant"]} | {entry["lr"]:g} | '
                     + ' | '.join(fmt(entry['metrics'].get(key)) for key in keys) + ' | '
                     + ' | '.join(differences) + f' | {fmt(entry["final_loss"], 3)} |')
    machine = result['machine']
    lines += ['', f'AP in percent (mmdet CocoMetric), mean ± sample std over seeds; Δ: mean of the per-seed '
              f'differences [95 % t interval over seeds]. Final loss: the training loss logged last (mmengine\'s '
              f'running mean). Plateaued: final loss ≥ {PLATEAU_FRACTION:g} × the loss logged at a quarter of the '
              f'run. Diverged: a non-finite loss, or a failure on non-finite values. Cells: '
              f'{result["cells"]}, {result["ran"]} run now, {result["reused"]} reused; wall time '
              f'{result["wall_s"] / 60:.1f} min on {machine["cpu"]} ({machine["usable_cpus"]} usable CPUs), '
              f'launcher {result["launcher"]}, {result["jobs"]} cell(s) at a time. Command: `{result["command"]}`']
    return '\n'.join(lines) + '\n'


def summary_of(suite, cells, rows, best, run):
    """The JSON summary; ``run`` holds how the cells were run: command, launcher, jobs, nproc, cells, ran,
    reused, wall_s, machine."""
    return dict(command=run['command'], suite=suite.path, launcher=run['launcher'], jobs=run['jobs'],
                nproc=run['nproc'], cells=len(cells), ran=run['ran'], reused=run['reused'], wall_s=run['wall_s'],
                machine=run['machine'], plateau_fraction=PLATEAU_FRACTION, metric=suite.metric,
                reference=suite.reference, rows=rows, best=best, cells_detail=[cell.to_json() for cell in cells])


def write_tables(suite, result, out_dir):
    """suite.json and suite.md in ``out_dir``; returns the markdown table."""
    with open(osp.join(out_dir, 'suite.json'), 'w') as f:
        json.dump(result, f, indent=1)
    table = markdown(suite, result['rows'], result['best'], result)
    with open(osp.join(out_dir, 'suite.md'), 'w') as f:
        f.write(f'# {suite.name}\n\n{suite.description}\n\n{table}\nPlots: ap_vs_lr.png, loss.png, kappa.png.\n')
    return table
