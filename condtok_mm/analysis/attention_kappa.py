"""The conditioning of attention per arm of a suite: κ of the quantities the paper's theory ties together (the
embedded tokens, the tokens entering the first block, what the first attention multiplies, every layer's softmax
attention matrix and attention output) at the start, middle and end of training, from the hook records of a
suite run (AttentionKappaHook's scalars in each cell's vis_data/scalars.json, every run of a resumed cell).

    python tools/analysis/attention_kappa.py RECORD_DIR [--out-dir DIR]
    # e.g. RECORD_DIR=docs/en/studies/records/demo_decisive_swin (a suite's --out-dir or its saved records)

Each arm is read at the rate its suite reports it (suite.json's chosen rates) on the reported seeds. κ spans orders
of magnitude, so each cell is summarised on log10 κ: per arm the geometric mean over seeds with a 95 % t interval,
and per arm beside its reference the ratio of κ (10 ** the mean per-seed difference of log10 κ, paired by seed)
with a 95 % t interval and the exact sign-flip p. Prints the table; writes attention_kappa.md, .json and .png.

The models compute in float32, in which a matrix with κ above SINGULAR_KAPPA = 2**24 is numerically singular: its κ
is set by rounding. The hook records the mean of κ over windows, so a geometric mean above 2**24 says only that some
windows were singular (tools/analysis/singular_attention.py counts them from a checkpoint): the table shows such a
cell as "numerically singular" with the seeds above 2**24, and gives no ratio, interval or p where either arm is
above 2**24 on a seed of the pair. The JSON keeps every number beside these flags; the table's header counts the
comparisons it holds (none corrected for multiplicity) and the smallest p their seed counts allow.
"""
import argparse
import json
import math
import os
import os.path as osp
import sys

import matplotlib

matplotlib.use('Agg')
import matplotlib.pyplot as plt  # noqa: E402
from tqdm import tqdm  # noqa: E402

from condtok_mm.engine.hooks.kappa_probe import SINGULAR_KAPPA
from condtok_mm.suites.plan import lr_name
from condtok_mm.suites.results import joined_records, record_stream, training_runs
from condtok_mm.suites.statistics import mean_std, paired_difference

# (hook key, what it is) in the order of the forward pass; layerNN keys are found in the records
QUANTITIES = [
    ('kappa/tokens_in_mean/stage0', 'embedded tokens X'),
    ('kappa/tokens_out_mean/stage0', 'tokens entering the first block (X + C)'),
    ('kappa/attn_input_centred_mean/stage0', "first attention's input (norm1, per window, centred)"),
]
LAYER_QUANTITIES = [('kappa/attn_softmax_mean/', 'softmax attention matrix'),
                    ('kappa/attn_out_mean/', 'attention output softmax(QK^T)V')]
PHASES = ('start', 'middle', 'end')


def hook_curves(work_dir):
    """{key: {iteration: value}} of the kappa records of a cell's training runs, joined as one run's."""
    curves = {}
    for record in joined_records(training_runs(work_dir)):
        if record_stream(record)[0] != 'hook':
            continue  # a training log or a validation
        for key, value in record.items():
            if key.startswith('kappa/') and isinstance(value, (int, float)):
                curves.setdefault(key, {})[record['step']] = value
    return curves


def phase_iterations(iterations):
    """The recorded iterations read as the start (the first), the middle (nearest half way) and the end (the
    last) of training."""
    iterations = sorted(iterations)
    last = iterations[-1]
    middle = min(iterations, key=lambda it: (abs(it - last / 2), it))
    return dict(start=iterations[0], middle=middle, end=last)


def quantities_of(curves):
    """[(key, label)] of the quantities every cell recorded, in the order of the forward pass."""
    keys = set.intersection(*(set(c) for c in curves)) if curves else set()
    found = [(key, label) for key, label in QUANTITIES if key in keys]
    for prefix, label in LAYER_QUANTITIES:
        found += [(key, f'{label}, layer {int(key[len(prefix) + 5:])}') for key in sorted(keys)
                  if key.startswith(prefix)]
    return found


def singular_seeds(values):
    """How many of ``values`` (κ, one per seed) exceed SINGULAR_KAPPA: numerically singular in float32."""
    return sum(value > SINGULAR_KAPPA for value in values)


def log_summary(values):
    """Geometric mean and 95 % t interval (of log10) of positive finite values, how many of them are above
    SINGULAR_KAPPA and whether the geometric mean is (``singular``); None without one."""
    logs = {seed: math.log10(value) for seed, value in values.items() if value > 0 and math.isfinite(value)}
    summary = mean_std(list(logs.values()))
    if summary is None:
        return None
    geomean = 10 ** summary['mean']
    result = dict(geomean=geomean, low=None, high=None, n=summary['n'], per_seed=values,
                  singular=geomean > SINGULAR_KAPPA, singular_seeds=singular_seeds(values[seed] for seed in logs))
    if summary['std'] is not None:
        from scipy import stats
        half = stats.t.ppf(0.975, summary['n'] - 1) * summary['std'] / math.sqrt(summary['n'])
        result.update(low=10 ** (summary['mean'] - half), high=10 ** (summary['mean'] + half))
    return result


def ratio(values, reference):
    """κ of an arm over its reference's, paired by seed on log10: 10 ** (mean, low, high) and the exact p, with how
    many of the paired seeds are above SINGULAR_KAPPA in the arm and in the reference; ``comparable`` where none
    is (a ratio of values set by float32 rounding says nothing of the matrices)."""
    logs = {seed: math.log10(v) for seed, v in values.items() if v > 0 and math.isfinite(v)}
    reference_logs = {seed: math.log10(v) for seed, v in reference.items() if v > 0 and math.isfinite(v)}
    difference = paired_difference(logs, reference_logs)
    if difference is None:
        return None
    arm_singular = singular_seeds(values[seed] for seed in difference['seeds'])
    reference_singular = singular_seeds(reference[seed] for seed in difference['seeds'])
    return dict(ratio=10 ** difference['mean'], low=None if difference['low'] is None else 10 ** difference['low'],
                high=None if difference['high'] is None else 10 ** difference['high'], p=difference['p'],
                n=difference['n'], per_seed=[10 ** d for d in difference['per_seed']],
                singular_seeds=arm_singular, reference_singular_seeds=reference_singular,
                comparable=arm_singular == 0 and reference_singular == 0)


def gather(record_dir):
    """(arms, quantities, phases, table) of a suite run's records: each arm with its rate, seeds and reference;
    table[key][phase][arm] = dict(summary, ratio to the reference)."""
    with open(osp.join(record_dir, 'suite.json')) as f:
        suite = json.load(f)
    arms = [dict(variant=row['variant'], lr=row['lr'], seeds=row['seeds'], reference=row['reference'])
            for row in suite['best'] if row['seeds']]
    curves = {}
    cells = [(arm, seed) for arm in arms for seed in arm['seeds']]
    for arm, seed in tqdm(cells, desc='cells', unit='cell'):
        work_dir = osp.join(record_dir, arm['variant'], lr_name(arm['lr']), f'seed{seed}')
        curves[arm['variant'], seed] = hook_curves(work_dir)
    if not any(curves.values()):
        raise ValueError(f'{record_dir}: its cells hold no kappa/ records; were they trained with '
                         'AttentionKappaHook in custom_hooks?')
    quantities = quantities_of([c for c in curves.values() if c])
    iterations = set.intersection(*(set(c[key]) for c in curves.values() if c for key, _ in quantities))
    phases = phase_iterations(iterations)
    table = {}
    for key, _ in quantities:
        for phase, iteration in phases.items():
            by_arm = {arm['variant']: {seed: curves[arm['variant'], seed][key][iteration] for seed in arm['seeds']
                                       if key in curves[arm['variant'], seed]} for arm in arms}
            references = {arm['variant']: by_arm.get(arm['reference']) for arm in arms if arm['reference']}
            table.setdefault(key, {})[phase] = {
                arm['variant']: dict(summary=log_summary(by_arm[arm['variant']]),
                                     ratio=ratio(by_arm[arm['variant']], references[arm['variant']])
                                     if references.get(arm['variant']) else None) for arm in arms}
    return arms, quantities, phases, table


def fmt_kappa(value):
    if value is None:
        return '—'
    exponent = math.floor(math.log10(value))
    return f'{value:.2f}' if -1 <= exponent < 3 else f'{value / 10 ** exponent:.1f}e{exponent}'


def fmt_summary(summary):
    """An arm's κ: the geometric mean [interval], or "numerically singular" where that mean is above 2**24; with the
    seeds above 2**24 where any is."""
    if summary is None:
        return '—'
    singular = f'singular on {summary["singular_seeds"]} of {summary["n"]} seeds'
    if summary['singular']:
        return f'numerically singular ({singular})'
    text = f'{fmt_kappa(summary["geomean"])} [{fmt_kappa(summary["low"])}, {fmt_kappa(summary["high"])}]'
    return text + (f' ({singular})' if summary['singular_seeds'] else '')


def fmt_ratio(ratio_, variant, reference):
    """An arm's κ over its reference's: ×ratio [interval] p, or why there is none."""
    if not ratio_['comparable']:
        return (f'not comparable: numerically singular on {ratio_["singular_seeds"]} of {ratio_["n"]} seeds '
                f'({variant}) / {ratio_["reference_singular_seeds"]} of {ratio_["n"]} ({reference})')
    return (f'×{fmt_kappa(ratio_["ratio"])} [{fmt_kappa(ratio_["low"])}, {fmt_kappa(ratio_["high"])}] '
            f'p={ratio_["p"]:.3g}')


def fmt_cell(entry, arm):
    """An arm's table cell: its κ and, beside a reference, the ratio to the reference's."""
    if entry['summary'] is None:
        return '—'
    text = fmt_summary(entry['summary'])
    if entry['ratio'] is not None:
        text += '; ' + fmt_ratio(entry['ratio'], arm['variant'], arm['reference'])
    return text


def comparisons(table):
    """The ratios of the table that are shown with a p: every comparable one with a p."""
    return [entry['ratio'] for by_phase in table.values() for by_arm in by_phase.values()
            for entry in by_arm.values()
            if entry['ratio'] is not None and entry['ratio']['comparable'] and entry['ratio']['p'] is not None]


def p_floors(table):
    """{n: 2 / 2^n} for each count n of paired seeds among the comparisons: the smallest exact sign-flip p."""
    return {n: 2 / 2 ** n for n in sorted({ratio_['n'] for ratio_ in comparisons(table)})}


def markdown(arms, quantities, phases, table, record_dir):
    """The table of :func:`gather`'s (arms, quantities, phases, table) of ``record_dir`` (named in its header),
    with its caption; the same from attention_kappa.json's fields."""
    count = len(comparisons(table))
    floors = ', '.join(f'{floor:.3g} with {n} seeds (2/2^{n})' for n, floor in p_floors(table).items())
    lines = [f'κ per arm of {record_dir}, at iterations {", ".join(f"{p} {i}" for p, i in phases.items())}; '
             f'{count} comparisons (× with a p), none corrected for multiplicity'
             + (f'; the smallest p the seeds allow: {floors}' if floors else ''), '',
             '| quantity | phase | ' + ' | '.join(f'{a["variant"]} (lr {a["lr"]:g})' for a in arms) + ' |',
             '|---|---|' + '---|' * len(arms)]
    for key, label in quantities:
        for phase in PHASES:
            lines.append(f'| {label} | {phase} ({phases[phase]}) | '
                         + ' | '.join(fmt_cell(table[key][phase][a['variant']], a) for a in arms) + ' |')
    references = sorted({a['reference'] for a in arms if a['reference']})
    lines += ['', 'κ: geometric mean over the seeds [95 % t interval of log10 κ]; ×: κ over the reference arm\'s '
              f'({", ".join(references)}), 10 ** the mean per-seed difference of log10 κ [95 % t interval], '
              'p: exact two-sided sign-flip p of those differences. Means over heads, windows and images as the '
              'hook records them (docs/en/user_guides/hooks.md).', '',
              f'The models compute in float32: a matrix with κ above 2^24 = {SINGULAR_KAPPA:.0f} (1/u, u = 2^-24 '
              'float32\'s unit roundoff) cannot be told from a singular one, and its κ is set by rounding. '
              '"numerically singular": the geometric mean over the seeds of the mean over windows (images, for '
              'the tokens) is above 2^24, so at least some windows are singular to float32; how many is not '
              'recorded by the hook (tools/analysis/singular_attention.py measures it from a checkpoint). '
              '"singular on k of n seeds": the seeds whose value is above 2^24. "not comparable": the arm or its '
              'reference is above 2^24 on some seed of the pair, so no ratio, interval or p is given. '
              'attention_kappa.json keeps every number.']
    return '\n'.join(lines)


def plot(arms, quantities, phases, table, path):
    layer_keys = [(prefix, label) for prefix, label in LAYER_QUANTITIES]
    fig, axes = plt.subplots(len(layer_keys), len(PHASES), figsize=(5 * len(PHASES), 3.6 * len(layer_keys)),
                             squeeze=False, constrained_layout=True)
    for row, (prefix, label) in enumerate(layer_keys):
        keys = [key for key, _ in quantities if key.startswith(prefix)]
        for column, phase in enumerate(PHASES):
            ax = axes[row][column]
            for arm in arms:
                summaries = [table[key][phase][arm['variant']]['summary'] for key in keys]
                layers = [i for i, s in enumerate(summaries) if s is not None]
                means = [summaries[i]['geomean'] for i in layers]
                lows = [summaries[i]['geomean'] - (summaries[i]['low'] or summaries[i]['geomean']) for i in layers]
                highs = [(summaries[i]['high'] or summaries[i]['geomean']) - summaries[i]['geomean'] for i in layers]
                ax.errorbar(layers, means, yerr=[lows, highs], marker='o', capsize=3, label=arm['variant'])
            ax.axhline(SINGULAR_KAPPA, color='gray', linestyle='--', linewidth=0.8,
                       label='2^24 (above: numerically singular in float32)')
            ax.set_yscale('log')
            ax.set_xticks(range(len(keys)))
            ax.set_xlabel('layer')
            ax.set_title(f'{label}, {phase} (iteration {phases[phase]})', fontsize=9)
            if column == 0:
                ax.set_ylabel('κ (geometric mean, 95 % t interval)')
    axes[0][0].legend(fontsize=8)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None):
    parser = argparse.ArgumentParser(description="κ of the tokens and of every attention layer per arm of a suite")
    parser.add_argument('record_dir', help="a suite run's --out-dir or its saved records (holding suite.json)")
    parser.add_argument('--out-dir', help='where the .md, .json and .png go (default: RECORD_DIR)')
    args = parser.parse_args(argv)
    if not osp.isfile(osp.join(args.record_dir, 'suite.json')):
        parser.error(f'{args.record_dir} holds no suite.json: give the --out-dir of a gathered suite run '
                     '(tools/suites/run_suite.py SUITE --gather-only --out-dir DIR writes it)')
    try:
        arms, quantities, phases, table = gather(args.record_dir)
    except ValueError as error:
        sys.exit(f'error: {error}')
    out_dir = args.out_dir or args.record_dir
    os.makedirs(out_dir, exist_ok=True)
    text = markdown(arms, quantities, phases, table, args.record_dir)
    print(text)
    with open(osp.join(out_dir, 'attention_kappa.md'), 'w') as f:
        f.write(text + '\n')
    with open(osp.join(out_dir, 'attention_kappa.json'), 'w') as f:
        json.dump(dict(record_dir=args.record_dir, arms=arms, phases=phases, singular_kappa=SINGULAR_KAPPA,
                       comparisons=len(comparisons(table)), p_floors=p_floors(table),
                       quantities=[dict(key=key, label=label) for key, label in quantities], table=table), f,
                  indent=1)
    plot(arms, quantities, phases, table, osp.join(out_dir, 'attention_kappa.png'))
    print(f'wrote attention_kappa.md, .json and .png in {out_dir}')


if __name__ == '__main__':
    main()
