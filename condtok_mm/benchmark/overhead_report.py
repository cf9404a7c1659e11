"""The tables and the plot of tools/benchmark/overhead.py's results: each table built once as rows of cells and
written as aligned text (printed) and as markdown (overhead.md, ready for the docs)."""
import matplotlib

matplotlib.use('Agg')
import matplotlib.pyplot as plt  # noqa: E402

MEMORY_GOAL = 1.0  # % extra peak memory
FLOOR_GOAL = 1.5  # the conditioner's time / its two float64 products
IMPLEMENTATIONS = ('conditioner', 'floor (two float64 products)', 'torch.linalg.svd')
# A consumer GPU's float64 rate, for the float64 FLOPs' time: 1/32-1/64 of some 40-80 TFLOP/s float32.
CONSUMER_FLOAT64_FLOPS = 1e12


def verdict(value, goal):
    return 'met' if value <= goal else 'NOT met'


class Table:
    """A header and rows of string cells, aligned by ``align`` ('l' or 'r' for each column), each text column
    at least ``widths`` wide; notes follow the table."""

    def __init__(self, header, align, widths):
        self.header, self.align, self.widths, self.rows, self.notes = header, align, widths, [], []

    def text(self):
        widths = [max([w, len(h)] + [len(row[i]) for row in self.rows])
                  for i, (h, w) in enumerate(zip(self.header, self.widths))]
        lines = [' '.join(cell.ljust(w) if a == 'l' else cell.rjust(w)
                          for cell, w, a in zip(row, widths, self.align)).rstrip()
                 for row in [self.header] + self.rows]
        return '\n'.join(lines + self.notes)

    def markdown(self):
        rule = ['---' if a == 'l' else '---:' for a in self.align]
        lines = ['| ' + ' | '.join(cell.replace('|', '\\|') for cell in row) + ' |'
                 for row in [self.header, rule] + self.rows]
        return '\n'.join(lines + [''] + self.notes)


def steps_table(results):
    table = Table(['model', 'phase', 'baseline', 'conditioned', 'overhead', 'goal'], 'llrrrl', [9, 10, 11, 12, 9, 0])
    for name, r in results.items():
        for phase in ('train', 'inference'):
            p = r[phase]
            goal = (f'<= {r["step_goal_percent"]:g} %: {verdict(p["overhead_percent"], r["step_goal_percent"])}'
                    if phase == 'train' else '')
            table.rows.append([name, phase, f'{p["baseline_s"]:.3f} s', f'{p["conditioned_s"]:.3f} s',
                               f'{p["overhead_percent"]:+.2f}%', goal])
        for phase, m in r.get('memory', {}).get('peaks', {}).items():
            table.rows.append([name, f'mem {phase}', f'{m["baseline_bytes"] / 2**30:.3f} GiB',
                               f'{m["conditioned_bytes"] / 2**30:.3f} GiB', f'{m["overhead_percent"]:+.2f}%',
                               f'<= {MEMORY_GOAL:g} %: {verdict(m["overhead_percent"], MEMORY_GOAL)} '
                               f'({r["memory"]["kind"]})'])
    return table


def conditioner_table(results):
    table = Table(['model', 'tokens (B, N, d)', 'implementation', 'time', 'kappa before', 'kappa after',
                   'launches/batch', 'syncs/batch', 'float64 GFLOP/image', 'note'],
                  'lllrrrrrrl', [9, 22, 30, 10, 13, 12, 0, 0, 0, 0])
    for name, r in results.items():
        c = r['conditioner']
        for impl in [key for key in IMPLEMENTATIONS if key in c]:
            m = c[impl]
            note = (f'{c["percent_of_baseline_train_step"]:.2f} % of training, '
                    f'{c["percent_of_baseline_inference"]:.2f} % of inference, {m["times_floor"]:.2f}x the floor '
                    f'(goal <= {FLOOR_GOAL:g}x: {verdict(m["times_floor"], FLOOR_GOAL)})' if impl == 'conditioner'
                    else '')
            kappas = ([f'{m["kappa_before_max"]:.4g}', f'{m["kappa_after_max"]:.6f}'] if 'kappa_after_max' in m
                      else ['', ''])
            table.rows.append([name, str(tuple(c['tokens_shape'])), impl, f'{1000 * m["seconds"]:.1f} ms', *kappas,
                               str(m['launches_per_batch']), str(m['syncs_per_batch']),
                               f'{m["float64_flops_per_image"] / 1e9:.3f}', note])
        floor_flops = c['floor (two float64 products)']['float64_flops_per_image']
        table.notes.append(
            f'{name}: launches = {c["counted"]["launches"]}; syncs = {c["counted"]["syncs"]}. At '
            f'{CONSUMER_FLOAT64_FLOPS / 1e12:g} TFLOP/s float64 (a consumer GPU: 1/32-1/64 of its float32 rate) '
            f'the conditioner\'s float64 FLOPs take >= '
            f'{1000 * c["conditioner"]["float64_flops_per_image"] / CONSUMER_FLOAT64_FLOPS:.2f} ms per image '
            f'(its floor\'s {1000 * floor_flops / CONSUMER_FLOAT64_FLOPS:.2f} ms).')
    return table


def methods_table(results):
    """The methods side by side: each one's overhead over the baseline in every phase."""
    table = Table(['model', 'method', 'train', 'inference', 'peak memory', 'conditioner'], 'llrrrr',
                  [9, 12, 16, 16, 12, 12])
    for name, r in results.items():
        for method, m in r['methods'].items():
            peak = max((p['overhead_percent'] for p in m.get('memory', {}).values()), default=None)
            alone = (r['conditioner']['conditioner'] if method == 'conditioned' else m.get('conditioner'))
            table.rows.append([name, method] + [
                f'{1000 * m[phase]["seconds"]:.0f} ms {m[phase]["overhead_percent"]:+.1f}%'
                for phase in ('train', 'inference')]
                + [f'{peak:+.2f}%' if peak is not None else '—',
                   f'{1000 * alone["seconds"]:.1f} ms' if alone else 'none'])
    return table


def tables(results):
    """Every table of the report, in order (the methods only when --methods added some)."""
    found = [steps_table(results), conditioner_table(results)]
    if any(len(r['methods']) > 1 for r in results.values()):
        found.append(methods_table(results))
    return found


def print_tables(results, machine_line):
    print(f'machine: {machine_line}')
    print('\n\n'.join(table.text() for table in tables(results)))


def markdown(results, machine_line, command):
    parts = [f'Machine: {machine_line}. Command: `{command}`'] + [table.markdown() for table in tables(results)]
    return '\n\n'.join(parts) + '\n'


def plot(results, path):
    fig, ax = plt.subplots(figsize=(9, 4.5), constrained_layout=True)
    labels, values, goals = [], [], []
    for name, r in results.items():
        for phase in ('train', 'inference'):
            labels.append(f'{name}\n{phase} time')
            values.append(r[phase]['overhead_percent'])
            goals.append(r['step_goal_percent'] if phase == 'train' else None)
        labels.append(f'{name}\nconditioner alone\n/ train step')
        values.append(r['conditioner']['percent_of_baseline_train_step'])
        goals.append(r['step_goal_percent'])
        for phase, m in r.get('memory', {}).get('peaks', {}).items():
            labels.append(f'{name}\n{phase} memory')
            values.append(m['overhead_percent'])
            goals.append(MEMORY_GOAL)
    bars = ax.bar(range(len(values)), values, color=['tab:blue' if g is None or v <= g else 'tab:red'
                                                     for v, g in zip(values, goals)])
    for index, goal in enumerate(goals):
        if goal is not None:
            ax.hlines(goal, index - 0.4, index + 0.4, colors='black', linestyles='--')
    ax.bar_label(bars, fmt='%+.2f%%', fontsize=8)
    ax.axhline(0, color='grey', linewidth=0.8)
    ax.set_xticks(range(len(values)), labels, fontsize=8)
    ax.set_ylabel('conditioned vs baseline, %')
    ax.set_title('Conditioned vs baseline twin: medians of interleaved steps, and the conditioner timed alone '
                 '(dashed: goal)', fontsize=10)
    fig.savefig(path, dpi=110)
