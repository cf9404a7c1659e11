"""The curves TrainingDynamicsHook recorded, and where each variant separates from the reference."""
import math
import re

from condtok_mm.engine.hooks.training_dynamics import BLOCK_QUANTITIES
from condtok_mm.suites.results import scalar_records

# The quantities of the whole model, beside the per-block ones (BLOCK_QUANTITIES)
GLOBAL_QUANTITIES = ('loss_smoothed', 'loss', 'grad_norm_total')


def read_dynamics(path):
    """{name: {'iter': [...], 'value': [...]}} of the TrainingDynamicsHook scalars in the scalars.json at ``path``;
    the name drops the 'dynamics/' prefix (e.g. 'stream_rms/stages.0.blocks.0', 'loss')."""
    curves = {}
    for record in scalar_records(path):
        for key, value in record.items():
            if key.startswith('dynamics/'):
                curve = curves.setdefault(key[len('dynamics/'):], dict(iter=[], value=[]))
                curve['iter'].append(record['step'])
                curve['value'].append(value)
    if not curves:
        raise RuntimeError(f'{path} holds no dynamics/ scalars: TrainingDynamicsHook did not record')
    return curves


def natural_key(name):
    """'stages.0.blocks.10' after 'stages.0.blocks.2'."""
    return [int(part) if part.isdigit() else part for part in re.split(r'(\d+)', name)]


def blocks_of(curves):
    """The blocks a variant's ``curves`` (:func:`read_dynamics`) cover, in the model's order."""
    return sorted({key.split('/', 1)[1] for key in curves if key.startswith('stream_rms/')}, key=natural_key)


def separation(reference, variant, factor):
    """Where ``variant`` differs from ``reference`` (two curves) by more than ``factor``, over the iterations
    both recorded with positive finite values: the first such iteration, the iteration from which every later
    one does too (None if none does), and variant/reference at the last common iteration."""
    ref = dict(zip(reference['iter'], reference['value']))
    var = dict(zip(variant['iter'], variant['value']))
    steps = [s for s in sorted(set(ref) & set(var))
             if all(math.isfinite(v) and v > 0 for v in (ref[s], var[s]))]
    ratios = [var[s] / ref[s] for s in steps]
    apart = [max(r, 1 / r) > factor for r in ratios]
    first = next((s for s, a in zip(steps, apart) if a), None)
    sustained = None
    for step, is_apart in reversed(list(zip(steps, apart))):
        if not is_apart:
            break
        sustained = step
    return dict(first=first, sustained=sustained, end_step=steps[-1] if steps else None,
                end_ratio=ratios[-1] if ratios else None)


def separation_rows(curves, reference, factor):
    """One row per quantity and block (and per global quantity): its :func:`separation` from the reference for
    every other variant.

    Args:
        curves (dict): {variant: its curves (:func:`read_dynamics`)}.
        reference (str): the variant the others are compared with.
        factor (float): a variant differs where variant/reference is above it or below its inverse.
    """
    blocks = blocks_of(curves[reference])
    places = [(q, b) for q in BLOCK_QUANTITIES for b in blocks] + [(q, None) for q in GLOBAL_QUANTITIES]
    rows = []
    for quantity, block in places:
        key = f'{quantity}/{block}' if block else quantity
        if key not in curves[reference]:
            continue
        row = dict(quantity=quantity, block=block or 'model', key=key, variants={})
        for name, variant_curves in curves.items():
            if name != reference and key in variant_curves:
                row['variants'][name] = separation(curves[reference][key], variant_curves[key], factor)
        rows.append(row)
    return rows


def markdown_table(rows, reference, factor):
    """The :func:`separation_rows` as a markdown table: per variant, the first iteration apart, the one it stays
    apart from and its ratio to the ``reference`` at the end (``factor``: the one the rows were made with)."""
    others = list(rows[0]['variants']) if rows else []
    header = ['quantity', 'block']
    for name in others:
        header += [f'{name}: first >{factor:g}x', f'{name}: stays from', f'{name}/{reference} at end']
    lines = ['| ' + ' | '.join(header) + ' |', '|' + '---|' * len(header)]

    def step(value):
        return '—' if value is None else str(value)

    for row in rows:
        cells = [row['quantity'], row['block']]
        for name in others:
            found = row['variants'].get(name, {})
            ratio = found.get('end_ratio')
            cells += [step(found.get('first')), step(found.get('sustained')),
                      '—' if ratio is None else f'{ratio:.3g}']
        lines.append('| ' + ' | '.join(cells) + ' |')
    return '\n'.join(lines)


def log2_ratio(reference, variant):
    """log2(variant / reference) at the reference's iterations (nan where either is missing or not positive)."""
    var = dict(zip(variant['iter'], variant['value']))
    values = []
    for step, ref in zip(reference['iter'], reference['value']):
        other = var.get(step, math.nan)
        values.append(math.log2(other / ref) if ref > 0 and other > 0 else math.nan)
    return values
