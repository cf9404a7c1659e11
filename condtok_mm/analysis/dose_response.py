"""Dose-response of a suite's methods: AP against each method's strength, from a finished suite run.

    python tools/analysis/dose_response.py configs/suites/demo_dose_swin.py \
        --knob condtok=model.backbone.conditioning.target_kappa --knob spectral=model.backbone.lam \
        --knob graying=model.backbone.conditioning.epsilon [--out-dir work_dirs/suites/demo_dose_swin]

Each ``--knob METHOD=KEY`` names a variant of the suite (the method at its published setting) and the config key
of its strength. The method's doses are the other variants with the same config, which differ from it in
``cfg_options`` and run at one learning rate (``lrs=dict(best_of=METHOD)``). The curve of a method is its own
row at that rate and each dose's row, with the strength read from the variant's config after its cfg_options.
Differences are paired by seed, with 95 % t intervals: against the method's published setting at the same rate,
and against the suite's reference at the reference's best rate. Reads OUT_DIR/suite.json
(tools/suites/run_suite.py); writes dose.json, dose.md and dose.png there and prints the table.
"""
import argparse
import json
import os.path as osp
import sys

from condtok_mm.suites.plan import Cell, resolved_config
from condtok_mm.suites.report import fmt, fmt_difference, seeds_text
from condtok_mm.suites.schema import SuiteError, load_suite
from condtok_mm.suites.statistics import best_lr, mean_std, metric_by_seed, paired_difference, reported_metrics
from condtok_mm.utils.package_files import package_root


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description='AP against each method\'s strength, from a finished suite run')
    parser.add_argument('suite', help='the suite file (configs/suites/*.py)')
    parser.add_argument('--knob', action='append', required=True, metavar='METHOD=KEY',
                        help='a variant of the suite and the config key of its strength (repeatable)')
    parser.add_argument('--out-dir', help='the suite run (suite.json); default work_dirs/suites/SUITE_NAME')
    return parser.parse_args(argv)


def lookup(cfg, key, where):
    value = cfg
    for part in key.split('.'):
        if not isinstance(value, dict) or part not in value:
            raise SystemExit(f'error: {where} has no {key!r} (missing {part!r}); give the config key of the '
                             'strength, e.g. model.backbone.lam')
        value = value[part]
    return value


def strength_of(variant, key, where):
    """The value at ``key`` of the variant's config after its cfg_options."""
    return lookup(resolved_config(variant.config_path, variant.options).to_dict(), key, where)


def curves(suite, knobs, summary):
    """{method: dict(key, lr, points=[...])}, each point a variant with its strength, metrics and differences."""
    variants = suite.variants
    cells = [cell for cell in map(Cell.from_json, summary['cells_detail']) if (cell.results or {}).get('metrics')]
    reference, metric = summary['reference'], summary['metric']
    reference_lr = best_lr(cells, reference, metric)
    metric_keys = reported_metrics(metric)  # the suite's metric first, then the others, as in its tables
    result = {}
    for method, key in knobs.items():
        if method not in variants:
            raise SystemExit(f'error: --knob {method}={key}: the suite has no variant {method!r} '
                             f'(it has {", ".join(variants)})')
        group = [name for name, variant in variants.items() if variant.config == variants[method].config]
        doses = [name for name in group if name != method]
        dose_lrs = {cell.lr for cell in cells if cell.variant in doses}
        if len(dose_lrs) > 1:
            raise SystemExit(f'error: the doses of {method!r} ran at several rates ({sorted(dose_lrs)}); a curve '
                             'needs them at one (lrs=dict(best_of=METHOD))')
        lr = dose_lrs.pop() if dose_lrs else best_lr(cells, method, metric)
        if lr is None:
            raise SystemExit(f'error: no finished cell of {method!r} in the run')
        points = []
        for name in group:
            values = {metric_key: metric_by_seed(cells, name, lr, metric_key) for metric_key in metric_keys}
            if not values[metric]:
                continue
            point = dict(variant=name, strength=strength_of(variants[name], key, f'variant {name!r}'),
                         published=name == method, seeds=sorted(values[metric]), metrics={},
                         difference_vs_published={}, difference_vs_reference={})
            for metric_key, by_seed in values.items():
                if not by_seed:
                    continue
                point['metrics'][metric_key] = mean_std(list(by_seed.values()))
                if name != method:
                    point['difference_vs_published'][metric_key] = paired_difference(
                        by_seed, metric_by_seed(cells, method, lr, metric_key))
                if reference_lr is not None:
                    point['difference_vs_reference'][metric_key] = paired_difference(
                        by_seed, metric_by_seed(cells, reference, reference_lr, metric_key))
            points.append(point)
        result[method] = dict(key=key, lr=lr, points=sorted(points, key=lambda point: point['strength']))
    reference_metrics = {metric_key: mean_std(list(by_seed.values())) for metric_key in metric_keys
                         if (by_seed := metric_by_seed(cells, reference, reference_lr, metric_key))}
    return result, dict(variant=reference, lr=reference_lr, metrics=reference_metrics)


def markdown(result, reference, metric):
    lines = ['| method | strength | lr | seeds | bbox AP | segm AP | Δ bbox AP vs published | '
             f'Δ bbox AP vs {reference["variant"]} (lr {reference["lr"]:g}) |', '|---|---|---|---|---|---|---|---|']
    for method, curve in result.items():
        knob = curve['key'].rsplit('.', 1)[-1]
        for point in curve['points']:
            published = ' (published)' if point['published'] else ''
            lines.append(
                f'| {method} | {knob} {point["strength"]:g}{published} | {curve["lr"]:g} | '
                f'{seeds_text(point["seeds"])} | {fmt(point["metrics"].get(metric))} | '
                f'{fmt(point["metrics"].get("coco/segm_mAP"))} | '
                f'{"—" if point["published"] else fmt_difference(point["difference_vs_published"].get(metric))} | '
                f'{fmt_difference(point["difference_vs_reference"].get(metric))} |')
    base = reference['metrics'].get(metric)
    lines.append('')
    lines.append(f'{reference["variant"]} at its best rate {reference["lr"]:g}: bbox AP {fmt(base)}. '
                 'AP in percent, mean ± sample std over seeds; Δ: mean of the per-seed differences [95 % t '
                 'interval].')
    return '\n'.join(lines) + '\n'


def plot(result, reference, metric, path):
    import matplotlib
    import matplotlib.ticker
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, len(result), figsize=(4.5 * len(result), 3.8), squeeze=False)
    base = reference['metrics'].get(metric)
    for ax, (method, curve) in zip(axes[0], result.items()):
        xs = [point['strength'] for point in curve['points']]
        means = [point['metrics'][metric]['mean'] for point in curve['points']]
        stds = [point['metrics'][metric]['std'] or 0 for point in curve['points']]
        ax.errorbar(xs, means, yerr=stds, marker='o', capsize=3, label=method)
        for point in curve['points']:
            if point['published']:
                ax.plot(point['strength'], point['metrics'][metric]['mean'], marker='*', markersize=14,
                        color='black', linestyle='none', label='published setting')
        if base:
            ax.axhline(base['mean'], color='grey', linestyle='--',
                       label=f'{reference["variant"]} (lr {reference["lr"]:g})')
            if base['std']:
                ax.axhspan(base['mean'] - base['std'], base['mean'] + base['std'], color='grey', alpha=0.15)
        if xs and min(xs) > 0 and max(xs) / min(xs) >= 10:
            ax.set_xscale('log')
        ax.set_xticks(xs, [f'{x:g}' for x in xs])  # the strengths run, not a log scale's decades
        ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
        ax.set_xlabel(curve['key'].rsplit('.', 1)[-1])
        ax.set_ylabel('bbox AP (mean ± std over seeds)')
        ax.set_title(f'{method} at lr {curve["lr"]:g}')
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None):
    args = parse_args(argv)
    knobs = {}
    for knob in args.knob:
        method, sep, key = knob.partition('=')
        if not sep or not method or not key:
            raise SystemExit(f'error: --knob {knob!r}: expected METHOD=KEY, e.g. spectral=model.backbone.lam')
        knobs[method] = key
    name = osp.splitext(osp.basename(args.suite))[0]
    out_dir = args.out_dir or osp.join('work_dirs', 'suites', name)
    summary_path = osp.join(out_dir, 'suite.json')
    if not osp.isfile(summary_path):
        raise SystemExit(f'error: no {summary_path}; run tools/suites/run_suite.py {args.suite} first, or give '
                         '--out-dir')
    with open(summary_path) as f:
        summary = json.load(f)
    try:
        suite = load_suite(args.suite, package_root())
    except SuiteError as error:
        raise SystemExit(f'error: {error}')
    result, reference = curves(suite, knobs, summary)
    metric = summary['metric']
    table = markdown(result, reference, metric)
    with open(osp.join(out_dir, 'dose.json'), 'w') as f:
        json.dump(dict(suite=args.suite, metric=metric, reference=reference, methods=result), f, indent=1)
    with open(osp.join(out_dir, 'dose.md'), 'w') as f:
        f.write(f'# {name}: dose-response\n\n{table}\nPlot: dose.png.\n')
    plot(result, reference, metric, osp.join(out_dir, 'dose.png'))
    print(table)
    print(f'wrote {", ".join(osp.join(out_dir, f) for f in ("dose.json", "dose.md", "dose.png"))}')


if __name__ == '__main__':
    sys.exit(main())
