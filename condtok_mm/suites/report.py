"""The report of a suite: the markdown tables (per variant and rate, each variant at its chosen rate, the
validations during training) and the JSON summary (every cell's values and curves, and the aggregates)."""
import collections
import dataclasses
import json
import os.path as osp

from condtok_mm.utils import write_whole_text
from .fingerprint import cell_record
from .results import UnreadableCellFile
from .statistics import REPORTED_METRICS, reported_metrics
from .tables import aggregate, validation_rows

REPORT_FILES = ('suite.md', 'suite.json', 'ap_vs_lr.png', 'seeds.png', 'loss.png', 'kappa.png')


def fmt(stat, digits=1):
    if stat is None:
        return 'n/a'
    if stat['std'] is None:
        return f'{stat["mean"]:.{digits}f}'
    return f'{stat["mean"]:.{digits}f} ± {stat["std"]:.{digits}f}'


def per_seed(values, digits=1, sign=''):
    return '(' + ' / '.join(f'{value:{sign}.{digits}f}' for value in values) + ')'


def fmt_values(stat, digits=1):
    """Mean ± std and the per-seed values: '5.3 ± 1.5 (5.0 / 7.0 / 4.0)'."""
    return 'n/a' if stat is None else f'{fmt(stat, digits)} {per_seed(stat["values"], digits)}'


def fmt_p(p):
    return 'n/a' if p is None else f'{p:.3g}'


def fmt_difference(difference, values=True, digits=1):
    """Mean [95 % t interval], the exact sign-flip p and the per-seed differences."""
    if difference is None:
        return 'n/a'
    if difference['low'] is None:
        text = f'{difference["mean"]:+.{digits}f} (1 seed)'
    else:
        text = (f'{difference["mean"]:+.{digits}f} [{difference["low"]:+.{digits}f}, '
                f'{difference["high"]:+.{digits}f}]')
    text += f' p={fmt_p(difference["p"])}'
    if values:
        text += ' ' + per_seed(difference['per_seed'], digits=digits, sign='+')
    return text


def seeds_text(seeds):
    return ', '.join(str(seed) for seed in seeds) if seeds else '-'


def fmt_escape(entry):
    """'2/3 (110 / — / 150)': the seeds that left the plateau and the iteration each did."""
    iterations = entry['escape_iteration']
    if not iterations:
        return 'n/a'
    return (f'{len(entry["escaped"])}/{len(iterations)} ('
            + ' / '.join('—' if iterations[seed] is None else str(iterations[seed]) for seed in iterations) + ')')


def vs(entry, suite):
    """The variant's name, with its reference where that is not the suite's."""
    if entry['reference'] is None or entry['reference'] == suite.reference:
        return entry['variant']
    return f'{entry["variant"]} (vs {entry["reference"]})'


def markdown(suite, rows, best, result):
    metric = suite.metric
    keys = reported_metrics(metric)
    names = [REPORTED_METRICS.get(key, key) for key in keys]
    second = names[1] if len(names) > 1 else names[0]
    selection = bool(suite.selection_seeds)
    lines = []
    if selection:
        lines += [f'Every rate on the selection seeds ({seeds_text(suite.selection_seeds)}), where each variant\'s '
                  'rate is chosen:', '']
    per_rate = [row for row in rows if row['role'] == ('selection' if selection else 'report')]
    lines += [f'| variant | lr | seeds | {" | ".join(names)} | Δ {names[0]} vs {suite.reference} (same lr) | '
              f'Δ {second} vs {suite.reference} | final loss | escaped (iteration) | diverged | failed |',
              '|---|---|---|' + '---|' * len(names) + '---|---|---|---|---|---|']
    for row in per_rate:
        differences = [fmt_difference(row['difference'].get(key)) if row['reference'] else '—' for key in keys[:2]]
        lines.append(f'| {vs(row, suite)} | {row["lr"]:g} | {seeds_text(row["seeds"])} | '
                     + ' | '.join(fmt_values(row['metrics'].get(key)) for key in keys) + ' | '
                     + ' | '.join(differences) + f' | {fmt_values(row["final_loss"], 3)} | {fmt_escape(row)} | '
                     f'{seeds_text(row["diverged"])} | {seeds_text(row["failed"])} |')
    if suite.held_out:
        lines += ['', 'Which images: the selection seeds\' values above are tools/test.py on the configs\' own test split '
                  '(the split the rates are chosen on); the reported seeds\' values below are on the held-out split '
                  f'({", ".join(f"`{option}`" for option in suite.held_out)}), which no choice read.']
    if suite.extend_top:
        lines += ['', 'A variant whose best rate on the selection seeds was its grid\'s top ran one more rate, twice '
                  'that, on the selection seeds before its rate was chosen (declared in the suite).']
    if all(entry['chosen_on'] == 'fixed' for entry in best):
        # nothing is chosen on these runs, so no choice can bias a difference
        heading = 'Each variant at its one learning rate, fixed in advance of these runs'
    else:
        chosen_where = (f'chosen on the selection seeds ({seeds_text(suite.selection_seeds)}), reported on the seeds '
                        f'{seeds_text(suite.seeds)}' if selection else
                        f'chosen on the reported seeds themselves ({seeds_text(suite.seeds)}; the suite has no '
                        'selection_seeds), so that a Δ at a chosen rate is biased upwards by the choice')
        heading = f'Each variant at its learning rate (by mean {REPORTED_METRICS.get(metric, metric)}, {chosen_where})'
    lines += ['', f'{heading}; Δ: paired by seed against its reference at the reference\'s rate:', '',
              f'| variant | lr | chosen on | seeds | {" | ".join(names)} | Δ {names[0]} vs {suite.reference} | '
              f'p Holm | Δ {second} vs {suite.reference} | final loss | escaped (iteration) |',
              '|---|---|---|---|' + '---|' * len(names) + '---|---|---|---|---|']
    for entry in best:
        differences = [fmt_difference(entry['difference'].get(key)) if entry['reference'] else '—'
                       for key in keys[:2]]
        lines.append(f'| {vs(entry, suite)} | {entry["lr"]:g} | {entry["chosen_on"]} | {seeds_text(entry["seeds"])} | '
                     + ' | '.join(fmt_values(entry['metrics'].get(key)) for key in keys) + ' | '
                     + f'{differences[0]} | {fmt_p(entry["p_holm"]) if entry["p_holm"] is not None else "—"} | '
                     + f'{differences[-1]} | {fmt_values(entry["final_loss"], 3)} | {fmt_escape(entry)} |')
    if result['validation']:
        lines += ['', f'{REPORTED_METRICS.get(metric, metric)} of the validations during training, each variant at '
                  'its rate on the reported seeds:', '',
                  f'| variant | lr | epoch | {names[0]} | Δ {names[0]} vs {suite.reference} |', '|---|---|---|---|---|']
        lines += [f'| {row["variant"]} | {row["lr"]:g} | {row["epoch"]} | {fmt_values(row["metric"])} | '
                  f'{fmt_difference(row["difference"]) if row["difference"] else "—"} |' for row in result['validation']]
    if suite.early_loss:
        lines += ['', f'Mean training loss over iterations 1–{suite.early_loss} (the mean of the losses logged there; '
                  'a spike when the conditioning is switched on shows here), each variant at its reported rate; Δ: '
                  'paired by seed against its reference at the reference\'s rate, uncorrected:', '',
                  f'| variant | lr | loss, iterations 1–{suite.early_loss} | Δ vs its reference |', '|---|---|---|---|']
        lines += [f'| {vs(entry, suite)} | {entry["lr"]:g} | {fmt_values(entry["early_loss"], 3)} | '
                  + (fmt_difference(entry['early_loss_difference'], digits=3) if entry['reference'] else '—') + ' |'
                  for entry in best]
    machine, rule = result['machine'], suite.escape
    family = (f'Holm: adjusted over the family {", ".join(suite.family)} (each against its reference, '
              f'{names[0]})' if suite.family else 'p Holm: the suite declares no family, so every p is per comparison, '
              'uncorrected')
    lines += ['', f'AP in percent (mmdet CocoMetric), mean ± sample std over seeds (the per-seed values in seed '
              f'order); Δ: mean of the per-seed differences [95 % t interval over seeds] p=exact two-sided sign-flip '
              f'(permutation) p-value over all 2^n sign patterns of the n paired differences (with n seeds no p is '
              f'below 2/2^n). {family}. Final loss: the training loss logged last (mmengine\'s running mean). '
              f'Escaped: the runs that left the initial loss plateau, and the iteration each did: the first '
              f'iteration after the warm-up where the loss (trailing mean over {rule.window} logged values) is at '
              f'most {1 - rule.margin:g} x its value at the end of the warm-up ('
              + (f'iteration {rule.after}' if rule.after is not None else "each config's LinearLR warm-up") +
              f'); —: did not. Diverged: a non-finite loss, or a failure on non-finite values. Cells: '
              f'{result["cells"]}, {result["ran"]} run now, {result["reused"]} reused; wall time '
              f'{result["wall_s"] / 60:.1f} min on {machine["cpu"]} ({machine["usable_cpus"]} usable CPUs), '
              f'launcher {result["launcher"]}, {result["jobs"]} cell(s) at a time; '
              f'{fmt_cell_times(result["cell_times"])}. Commits the cells ran at: '
              + (', '.join(f'{commit} ({n})' for commit, n in result['commits'].items()) or 'none') +
              '; CPUs: ' + (', '.join(f'{cpu} ({n})' for cpu, n in result['cpus'].items()) or 'none') +
              ' (a cell reruns bit-identically at one commit on one kind of CPU; on another kind, or after a '
              "change of the conditioner's numerics, the same cell's bbox AP moved by up to 1.9: "
              f'docs/en/studies/repeatability.md). Command: `{result["command"]}`']
    if result['unfingerprinted']:
        lines += ['', f'Reused without a fingerprint (--accept-unfingerprinted; not checked to be the cells this suite '
                  f'asks for): {", ".join(result["unfingerprinted"])}.']
    return '\n'.join(lines) + '\n'


def summary_of(suite, cells, run):
    """The JSON summary; ``run`` holds how the cells were run: command, launcher, jobs, nproc, ran, reused,
    wall_s, machine, unfingerprinted (the work dirs of cells reused without a fingerprint)."""
    rows, best = aggregate(suite, cells)
    records = [readable_record(cell) for cell in cells if osp.isdir(cell.work_dir)]  # each suite_cell.json once
    return dict(command=run['command'], suite=suite.path, launcher=run['launcher'], jobs=run['jobs'],
                nproc=run['nproc'], cells=len(cells), ran=run['ran'], reused=run['reused'], wall_s=run['wall_s'],
                machine=run['machine'], unfingerprinted=run['unfingerprinted'], metric=suite.metric,
                reference=suite.reference, seeds=suite.seeds, selection_seeds=suite.selection_seeds,
                family=suite.family, escape=dataclasses.asdict(suite.escape), early_loss=suite.early_loss,
                **(dict(held_out=suite.held_out) if suite.held_out else {}),
                **(dict(extend_top=True) if suite.extend_top else {}),
                rows=rows, best=best,
                validation=validation_rows(suite, cells, best), commits=commits_of(records), cpus=cpus_of(records),
                cell_times=cell_times_of(records, len(cells)), cells_detail=[cell.to_json() for cell in cells])


def readable_record(cell):
    """The cell's suite_cell.json, or {} where it has none or one that cannot be read (that cell is marked
    unreadable and named)."""
    try:
        return cell_record(cell) or {}
    except UnreadableCellFile:
        return {}


def commits_of(records):
    """{commit: number of cells} of the records (the suite_cell.json of each cell that has a work dir, {} where it has
    none; 'not recorded' for one without a commit)."""
    commits = collections.Counter(record.get('commit') or 'not recorded' for record in records)
    return dict(sorted(commits.items()))


def cpus_of(records):
    """{CPU kind (model and vector instructions): number of cells} of the records ('not recorded' where the record
    has none: a CPU not known, a format-1 record without the key, or no record)."""
    cpus = collections.Counter(record.get('cpu') or 'not recorded' for record in records)
    return dict(sorted(cpus.items()))


def cell_times_of(records, cells):
    """What the records say the cells' train and test commands took, in seconds: total, min and max a cell, and
    how many of the ``cells`` record it (a format-1 record may not); None where none does. Unlike the run's wall
    time, it holds for a suite gathered from records or run in several parts."""
    times = [record['wall_s'] for record in records if record.get('wall_s') is not None]
    if not times:
        return None
    return dict(total_s=sum(times), min_s=min(times), max_s=max(times), recorded=len(times), cells=cells)


def fmt_cell_times(times):
    if times is None:
        return 'no cell records the time its commands took'
    return (f"the cells' own train and test commands took {times['total_s'] / 60:.1f} min in all, "
            f"{times['min_s'] / 60:.1f}–{times['max_s'] / 60:.1f} min a cell ({times['recorded']} of "
            f"{times['cells']} cells record it)")


def write_tables(suite, result, out_dir):
    """suite.json and suite.md in ``out_dir``, each replaced whole; returns the markdown table."""
    write_whole_text(osp.join(out_dir, 'suite.json'), json.dumps(result, indent=1))
    table = markdown(suite, result['rows'], result['best'], result)
    write_whole_text(osp.join(out_dir, 'suite.md'), f'# {suite.name}\n\n{suite.description}\n\n{table}\nPlots: '
                     'ap_vs_lr.png, seeds.png, loss.png, kappa.png.\n')
    return table
