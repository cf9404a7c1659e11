"""Plot kappa over training iterations from the AttentionKappaHook scalars of one or more runs.

    python tools/analysis/plot_conditioning.py WORK_DIR [WORK_DIR ...] [--out conditioning.png]

One panel per quantity on a log axis; layers (or stages) colour-coded, runs told apart by line style and
labelled (e.g. a baseline and its conditioned twin overlaid).
"""
import argparse
import glob
import json
import os.path as osp
import sys

import matplotlib

matplotlib.use('Agg')
import matplotlib.pyplot as plt  # noqa: E402

PANELS = [
    ('kappa', 'tokens_in_mean', 'embedded tokens X, before the correction'),
    ('kappa', 'tokens_out_mean', 'X + C, the conditioner output (residual stream)'),
    ('kappa', 'attn_input_centred_mean', 'first attention input norm1(.), centred'),
    ('scale', 'correction_mean', 'token scale ||X + C|| / ||X||'),
    ('kappa', 'attn_softmax_mean', 'attention matrix softmax(QK^T) (mean)'),
    ('kappa', 'attn_softmax_max', 'attention matrix softmax(QK^T) (max)'),
    ('kappa', 'attn_out_mean', 'attention output A(X) (mean)'),
    ('kappa', 'w_q_mean', 'W_q (per head)'),
]
LINE_STYLES = ['-', '--', ':', '-.']


def load_kappa_scalars(work_dir):
    """{quantity: {where: ([steps], [values])}} from every run folder of a work dir (resumes included)."""
    files = sorted(glob.glob(osp.join(work_dir, '*', 'vis_data', 'scalars.json')))
    if not files:
        sys.exit(f'error: no vis_data/scalars.json under {work_dir}; train with AttentionKappaHook '
                 'in custom_hooks (our configs have it)')
    by_step = {}
    for path in files:
        with open(path) as f:
            for line in f:
                record = json.loads(line)
                kappas = {k: v for k, v in record.items() if k.startswith(('kappa/', 'scale/'))}
                if kappas:
                    by_step.setdefault(record['step'], {}).update(kappas)
    series = {}
    for step in sorted(by_step):
        for key, value in by_step[step].items():
            family, quantity, where = key.split('/')
            steps, values = series.setdefault(f'{family}/{quantity}', {}).setdefault(where, ([], []))
            steps.append(step)
            values.append(value)
    if not series:
        sys.exit(f'error: {work_dir} has scalars but no kappa/* values; was AttentionKappaHook on?')
    return series


def plot(runs, out):
    fig, axes = plt.subplots(2, 4, figsize=(20, 9), constrained_layout=True)
    for ax, (family, quantity, title) in zip(axes.flat, PANELS):
        for style, (label, series) in zip(LINE_STYLES * len(runs), runs.items()):
            curves = series.get(f'{family}/{quantity}', {})
            colours = plt.cm.viridis([i / max(1, len(curves) - 1) for i in range(len(curves))])
            for colour, (where, (steps, values)) in zip(colours, sorted(curves.items())):
                ax.plot(steps, values, style, color=colour, label=f'{label} {where}', linewidth=1.5)
        ax.set_yscale('log')
        ax.set_title(title)
        ax.set_xlabel('iteration')
        ax.set_ylabel(family)
        ax.grid(True, which='both', alpha=0.3)
        handles, labels = ax.get_legend_handles_labels()
        if handles:
            ax.legend(fontsize=7, ncol=2 if len(handles) > 8 else 1)
    fig.suptitle('Condition numbers during training: ' + ' vs '.join(
        f'{label} ({style.strip() or "solid"})' for style, label in zip(['solid', 'dashed', 'dotted',
                                                                        'dash-dot'], runs)))
    fig.savefig(out, dpi=110)
    plt.close(fig)


def last_values(series):
    """The latest recorded value of each summary quantity (attention kappa averaged over layers)."""
    def last(quantity, where):
        steps, values = series.get(quantity, {}).get(where, ([None], [float('nan')]))
        return values[-1], steps[-1]

    summary = {}
    for quantity in ('kappa/tokens_in_mean', 'kappa/tokens_out_mean', 'kappa/attn_input_centred_mean',
                     'scale/correction_mean'):
        for where in sorted(series.get(quantity, {})):
            summary[f'{quantity} {where}'] = last(quantity, where)
    for quantity in ('kappa/attn_softmax_mean', 'kappa/attn_out_mean'):
        layers = series.get(quantity, {})
        if layers:
            finals = [last(quantity, where) for where in layers]
            summary[f'{quantity} (layer avg)'] = (sum(v for v, _ in finals) / len(finals), finals[0][1])
    return summary


def print_table(runs):
    summaries = {label: last_values(series) for label, series in runs.items()}
    rows = sorted({row for summary in summaries.values() for row in summary})
    print(f'{"at the last recorded iteration":<44}' + ''.join(f'{label:>24}' for label in runs))
    for row in rows:
        cells = []
        for label in runs:
            value, step = summaries[label].get(row, (float('nan'), None))
            cells.append(f'{value:.3g} (it {step})' if step is not None else 'n/a')
        print(f'{row:<44}' + ''.join(f'{cell:>24}' for cell in cells))


def main():
    parser = argparse.ArgumentParser(description='Plot kappa over iterations for one or more runs')
    parser.add_argument('work_dirs', nargs='+', help='work dirs of runs with AttentionKappaHook')
    parser.add_argument('--labels', nargs='+', help='one label per work dir (default: folder names)')
    parser.add_argument('--out', help='output PNG (default: <first work dir>/conditioning.png)')
    args = parser.parse_args()
    labels = args.labels or [osp.basename(osp.normpath(w)) for w in args.work_dirs]
    if len(labels) != len(args.work_dirs):
        sys.exit(f'error: {len(labels)} labels for {len(args.work_dirs)} work dirs')
    runs = {label: load_kappa_scalars(w) for label, w in zip(labels, args.work_dirs)}
    out = args.out or osp.join(args.work_dirs[0], 'conditioning.png')
    print_table(runs)
    plot(runs, out)
    print(f'wrote {out}')


if __name__ == '__main__':
    main()
