"""The answer of a pre-registered study from its records, by the rule its suite file's header declared
(condtok_mm/suites/confirmatory.py applies it; its RULES name the studies: configs/suites/demo_confirm_swin.py, the
confirmatory shapes study, and configs/suites/neon_trees_swin.py, the NEON tree-crown study).

    python tools/analysis/confirmatory_answer.py RECORD_DIR [--suite NAME] [--out-dir DIR]
    # e.g. RECORD_DIR=docs/en/studies/records/demo_confirm_swin (the study's --out-dir or its saved records)
    # --suite: the study's suite file stem, a key of RULES (default: demo_confirm_swin)

Reads the cells as tools/suites/run_suite.py plans them (each arm's rate chosen on the selection seeds, then the
reported seeds at it). Prints the answer and its tables: the chosen rates (and whether at the grid's edge), the
test bbox AP of every arm, B - A and D - A (Holm over the two) and D - B (outside the family), each arm's
convergence gate, the readings, the test metrics the rule describes beside the endpoint (NEON: AP50 and the
small-crown AP, per arm and paired, uncorrected), the validation gaps at every epoch (described; the early-budget
one labelled where the rule names one), each reported cell's commit and CPU kind and the primary without the seeds
whose arms ran on different kinds. Until all reported cells have finished (or, where the rule says so, count as
test AP 0) the answer is "not resolved (incomplete)", the missing cells are named and the tables are marked
incomplete. Writes answer.md, answer.json and answer.png (the per-seed test differences with their intervals, and
the validation curves with the gate epochs, and the early budget where the rule names one) in --out-dir (default:
RECORD_DIR).
"""
import argparse
import json
import os
import os.path as osp
import sys

from tqdm import tqdm

from condtok_mm.suites.confirmatory import RULES, answer, gather_cells
from condtok_mm.suites.plots import save
from condtok_mm.suites.report import fmt_difference, fmt_p, fmt_values, seeds_text
from condtok_mm.suites.schema import SuiteError, load_suite
from condtok_mm.utils import write_whole_text
from condtok_mm.utils.package_files import package_root

ANSWER_FILES = ('answer.md', 'answer.json', 'answer.png')
EDGES = {'lowest': "at the grid's edge (its lowest rate)", 'extension': "at the grid's edge (the extension rate)",
         None: 'inside the grid'}


def fmt_lr(lr):
    """A rate, or 'not chosen' for None."""
    return 'not chosen' if lr is None else f'{lr:g}'


def fmt_gate(gate, counted_as_zero=()):
    """The gate's row cells: seeds, change, converged, rising (``counted_as_zero``: the arm's seeds counted as test
    AP 0, which leave it not converged)."""
    if gate is None:
        return '| n/a | n/a | no | no |'
    if counted_as_zero:
        converged = f'no (diverged, counted as test AP 0: {seeds_text(counted_as_zero)})'
    else:
        converged = 'yes' if gate['converged'] else ('no' if gate['complete'] else 'no (not every seed validated)')
    interval = ('(1 seed)' if gate['low'] is None else
                f'[{gate["low"]:+.2f}, {gate["high"]:+.2f}]')
    return (f'| {seeds_text(gate["seeds"])} | {gate["mean"]:+.2f} {interval} | {converged} | '
            f'{"yes" if gate["rising"] else "no"} |')


def markdown(result, rule, record_dir):
    """The answer (:func:`~condtok_mm.suites.confirmatory.answer` under ``rule``) of the records in ``record_dir``
    and its tables, as markdown."""
    reference, primary, family = rule.reference, rule.primary, rule.family
    lines = [f'# The answer of {rule.suite}', '', f'Records: {record_dir}.', '']
    if not result['complete']:
        lines += [f'**Incomplete: {result["finished"]} of the {result["expected"]} reported cells have finished; '
                  f'the answer is "{result["readings"][primary]["text"]}". The tables describe what exists '
                  '(incomplete) and decide nothing.**', '']
    for comparison in result['comparisons'][:len(family)]:
        arm = comparison['arm']
        found = result['readings'][arm]
        role = 'primary' if arm == primary else 'secondary'
        number = f'reading {found["number"]}, ' if found['number'] else ''
        lines.append(f'- {arm} − {reference} ({role}): {number}**{found["text"]}**')
    suffix = '' if result['complete'] else ' (incomplete)'
    lines += ['', f'## Each arm\'s rate, chosen on the selection seeds ({seeds_text(result["selection_seeds"])})', '',
              '| arm | chosen rate | where | bbox AP on the selection seeds per rate (validation images) |',
              '|---|---|---|---|']
    for name, rate in result['rates'].items():
        per_rate = '; '.join(f'{row["lr"]:g}: {fmt_values(row["metric"])} '
                             f'({row["metric"]["n"] if row["metric"] else 0} of {row["planned"]} cells)'
                             for row in rate['selection'])
        where = rate['waiting'] if rate['lr'] is None else EDGES[rate['edge']]
        lines.append(f'| {name} | {fmt_lr(rate["lr"])} | {where} | {per_rate or "—"} |')
    zero = rule.untestable_diverged_as_zero
    lines += ['', f'## Test bbox AP on the reported seeds ({seeds_text(result["seeds"])}), held-out split{suffix}', '',
              '| arm | lr | seeds | bbox AP | diverged (kept at their test AP) |'
              + (' diverged, untested (counted as test AP 0) |' if zero else ''),
              '|---|---|---|---|---|' + ('---|' if zero else '')]
    for name, arm in result['arms'].items():
        seeds = arm['test']['seeds'] if arm['test'] else []
        lines.append(f'| {name} | {fmt_lr(arm["lr"])} | {seeds_text(seeds)} | {fmt_values(arm["test"])} | '
                     f'{seeds_text(arm["diverged"])} |' + (f' {seeds_text(arm["counted_as_zero"])} |' if zero else ''))
    lines += ['', '| comparison | role | Δ bbox AP [95 % t interval] p (per seed) | p Holm |', '|---|---|---|---|']
    for comparison in result['comparisons']:
        arm = comparison['arm']
        role = (('primary' if arm == primary else 'secondary') + f', in the family {{{", ".join(family)}}}'
                if comparison['in_family'] else 'outside the family, uncorrected: supports no claim')
        holm = fmt_p(comparison['p_holm']) if comparison['in_family'] else '—'
        lines.append(f'| {arm} − {comparison["reference"]} | {role} | {fmt_difference(comparison["difference"])} | '
                     f'{holm} |')
    first, last = rule.gate_epochs
    lines += ['', f'## Convergence gate: validation bbox AP({last}) − AP({first}) per arm{suffix}', '',
              f'| arm | seeds | change [95 % t interval] | converged (\\|mean\\| < {rule.converged_below_ap:g}) | '
              f'rising (low > {rule.rising_above_ap:g}) |', '|---|---|---|---|---|']
    lines += [f'| {name} ' + fmt_gate(arm['gate'], arm['counted_as_zero']) for name, arm in result['arms'].items()]
    lines += described_lines(result, suffix)
    lines += ['', f'## Validation gaps at every epoch (validation images; described, not decided){suffix}', '',
              '| epoch | ' + ' | '.join(f'{arm} − {reference}' for arm in family) + ' |',
              '|---|' + '---|' * len(family)]
    gaps = {(gap['arm'], gap['epoch']): gap for gap in result['validation_gaps']}
    for epoch in sorted({epoch for _, epoch in gaps}):
        label = f'{epoch} (the early-budget comparison)' if epoch == rule.early_epoch else str(epoch)
        lines.append(f'| {label} | ' + ' | '.join(fmt_difference((gaps.get((arm, epoch)) or {}).get('difference'))
                                                 for arm in family) + ' |')
    lines += machine_lines(result, rule) + missing_lines(result)
    lines += ['', f'The rule (the suite\'s header): primary {primary} − {reference} on test bbox AP, paired by seed; '
              f'secondary {family[-1]} − {reference}; Holm over {{{", ".join(family)}}}; readings on the unadjusted '
              f'95 % t interval [lo, hi] and the Holm p, the first that holds: 1 lo > 0 and p ≤ {rule.alpha:g} and '
              f'{reference} converged and not rising; 2 lo > 0 and p ≤ {rule.alpha:g}; 3 hi < {rule.margin_ap:g} and '
              f'both arms converged and not rising ("the baseline ends ahead" where hi < 0); 4 not resolved. '
              f'Converged: |mean AP({last}) − AP({first})| < {rule.converged_below_ap:g} over every reported seed; '
              f'rising: its interval\'s low end > {rule.rising_above_ap:g}.'
              + (' A reported cell whose loss diverged and whose checkpoint the test could not score counts as test '
                 'AP 0, and its arm as not converged.' if rule.untestable_diverged_as_zero else '')
              + ' AP in percent; p: the exact two-sided sign-flip p over all 2^n sign patterns.']
    return '\n'.join(lines) + '\n'


def described_lines(result, suffix):
    """The test metrics the rule describes beside the endpoint: per arm, and the paired differences, uncorrected."""
    lines = []
    for described in result['described']:
        label = described['label']
        lines += ['', f'## Test {label} on the reported seeds, held-out split (described, uncorrected, deciding '
                  f'nothing){suffix}', '', f'| arm | {label} |', '|---|---|']
        lines += [f'| {name} | {fmt_values(values)} |' for name, values in described['arms'].items()]
        lines += ['', f'| comparison | Δ {label} [95 % t interval] p (per seed), uncorrected |', '|---|---|']
        lines += [f'| {c["arm"]} − {c["reference"]} | {fmt_difference(c["difference"])} |'
                  for c in described['comparisons']]
    return lines


def machine_lines(result, rule):
    """Each reported cell's commit and CPU kind by seed, the counts, and the seeds whose arms did not share one CPU
    kind with the primary described without them."""
    machine = result['machines']
    by_seed = {}
    for cell in machine['cells']:
        by_seed.setdefault(cell['seed'], {})[cell['variant']] = f'{cell["commit"]}, {cell["cpu"]}'
    arms = list(result['arms'])
    lines = ['', '## Where the reported cells ran (commit, CPU kind)', '', '| seed | ' + ' | '.join(arms) + ' |',
             '|---|' + '---|' * len(arms)]
    lines += [f'| {seed} | ' + ' | '.join(cells.get(arm, '—') for arm in arms) + ' |'
              for seed, cells in sorted(by_seed.items())]
    lines += ['', 'Commits: ' + (', '.join(f'{c} ({n})' for c, n in machine['commits'].items()) or 'none')
              + '; CPU kinds: ' + (', '.join(f'{c} ({n})' for c, n in machine['cpus'].items()) or 'none') + '.']
    if machine['mixed_seeds']:
        lines.append(f'Seeds whose three arms did not share one CPU kind: {seeds_text(machine["mixed_seeds"])}. '
                     f'{rule.primary} − {rule.reference} without them (described, not decided on): '
                     f'{fmt_difference(machine["primary_without_mixed"])}.')
    elif machine['whole_seeds']:
        lines.append(f'Every seed whose arms have all finished ({seeds_text(machine["whole_seeds"])}) ran its arms on '
                     'one CPU kind: no seed to leave out.')
    else:
        lines.append('No reported seed has all its arms finished yet.')
    return lines


def missing_lines(result):
    """The missing reported cells, those of one arm, rate and reason on one line."""
    if not result['missing']:
        return []
    groups = {}
    for cell in result['missing']:
        groups.setdefault((cell['variant'], cell['lr'], cell['why']), []).append(cell['seed'])
    return ['', f'## Reported cells missing ({len(result["missing"])} of {result["expected"]})', ''] + [
        f'- {variant} lr {fmt_lr(lr)}, seeds {seeds_text(seeds)}: {why}'
        for (variant, lr, why), seeds in groups.items()]


def plot(result, path):
    """answer.png: the per-seed test differences of the family with their means and 95 % intervals, and each arm's
    validation curve (mean over the reported seeds, band min-max) with the gate epochs marked, and the early budget
    where the rule names one."""
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    rule = result['rule']
    reference, family = rule['reference'], rule['family']
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 4.8), constrained_layout=True)
    means = [max(result['seeds']) + 1.5 * (i + 1) for i in range(len(family))]  # where each mean is drawn
    for i, comparison in enumerate(result['comparisons'][:len(family)]):
        difference = comparison['difference']
        if difference is None:
            continue
        colour = f'C{i + 1}'
        offset = 0.15 * (i - 0.5)
        left.plot([seed + offset for seed in difference['seeds']], difference['per_seed'], 'o', color=colour,
                  alpha=0.7, label=f'{comparison["arm"]} − {reference}, per seed')
        mean = difference['mean']
        low, high = (mean, mean) if difference['low'] is None else (difference['low'], difference['high'])
        left.errorbar([means[i]], [mean], yerr=[[mean - low], [high - mean]], fmt='D', capsize=4, color=colour,
                      label=f'mean, 95 % t interval (p Holm {fmt_p(comparison["p_holm"])})')
    left.axhline(0, color='0.3', linewidth=1)
    left.axhline(rule['margin_ap'], color='0.5', linestyle=':', linewidth=1, label=f'{rule["margin_ap"]:g} AP')
    left.set_xticks(list(result['seeds']) + means, [str(seed) for seed in result['seeds']] + ['mean'] * len(family))
    left.set_xlabel('reported seed; right: the means')
    left.set_ylabel('Δ test bbox AP (percent points)')
    left.set_title('test bbox AP against the baseline, paired by seed'
                   + ('' if result['complete'] else ' (incomplete)'), fontsize=10)
    left.grid(True, alpha=0.3)
    left.legend(fontsize=7)
    for i, (name, arm) in enumerate(result['arms'].items()):
        points = arm['validation']
        if not points:
            continue
        epochs = [point['epoch'] for point in points]
        right.plot(epochs, [point['mean'] for point in points], 'o-', color=f'C{i}',
                   label=f'{name} (lr {arm["lr"]:g}, up to {max(point["n"] for point in points)} seeds)')
        right.fill_between(epochs, [min(point['values']) for point in points],
                           [max(point['values']) for point in points], color=f'C{i}', alpha=0.15, linewidth=0)
    for epoch in rule['gate_epochs']:
        right.axvline(epoch, color='0.4', linestyle='--', linewidth=1)
    gate = f'dashed: the gate, {" and ".join(map(str, rule["gate_epochs"]))}'
    if rule['early_epoch'] is None:
        right.set_xlabel(f'epoch ({gate})')
    else:
        right.axvline(rule['early_epoch'], color='0.6', linestyle=':', linewidth=1)
        right.set_xlabel(f'epoch ({gate}; dotted: the early budget, {rule["early_epoch"]})')
    right.set_ylabel('validation bbox AP (mean over reported seeds, band min-max)')
    right.set_title('validations during training' + ('' if result['complete'] else ' (incomplete)'), fontsize=10)
    right.grid(True, alpha=0.3)
    if right.get_legend_handles_labels()[0]:
        right.legend(fontsize=8)
    save(fig, path, dpi=110)
    plt.close(fig)


def main(argv=None):
    parser = argparse.ArgumentParser(description="A pre-registered study's answer from its records, by the rule its "
                                     'suite file declared')
    parser.add_argument('record_dir', help="the study's --out-dir or its saved records "
                        '(e.g. docs/en/studies/records/demo_confirm_swin)')
    parser.add_argument('--suite', default='demo_confirm_swin',
                        help=f'the study, by its suite file stem: one of {", ".join(RULES)} (default: %(default)s)')
    parser.add_argument('--out-dir', help='where answer.md, .json and .png go (default: RECORD_DIR)')
    args = parser.parse_args(argv)
    if args.suite not in RULES:
        parser.error(f'--suite {args.suite!r} has no declared rule here; the studies with one: {", ".join(RULES)}')
    if not osp.isdir(args.record_dir):
        parser.error(f'{args.record_dir} is not a directory: give the study\'s --out-dir or its saved records')
    rule = RULES[args.suite]
    root = package_root()
    try:
        suite = load_suite(osp.join(root, rule.suite), root)
    except SuiteError as error:
        sys.exit(f'error: {error}')
    cells = gather_cells(suite, args.record_dir, progress=lambda new: tqdm(new, desc='cells', unit='cell'))
    result = answer(suite, cells, rule)
    out_dir = args.out_dir or args.record_dir
    os.makedirs(out_dir, exist_ok=True)
    text = markdown(result, rule, args.record_dir)
    print(text)
    write_whole_text(osp.join(out_dir, 'answer.md'), text)
    write_whole_text(osp.join(out_dir, 'answer.json'), json.dumps(dict(record_dir=args.record_dir, **result), indent=1))
    plot(result, osp.join(out_dir, 'answer.png'))
    print('wrote ' + ', '.join(osp.join(out_dir, name) for name in ANSWER_FILES))


if __name__ == '__main__':
    main()
