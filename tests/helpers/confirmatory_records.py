"""For the tests of the pre-registered studies' answers (condtok_mm/suites/confirmatory.py): a study's records
written as its runner leaves them (every selection cell, the reported cells at each arm's best rate with chosen test
APs and validations, each with its suite_cell.json), and the float64 references the answers are checked against."""
import hashlib
import itertools
import math
import os.path as osp

import numpy as np
from scipy import stats

from condtok_mm.suites.confirmatory import answer, gather_cells
from condtok_mm.suites.fingerprint import write_fingerprint
from condtok_mm.suites.plan import make_cell
from helpers.suite_runs import write_cell

A, B, D = 'A_baseline', 'B_conditioned', 'D_norm_matched'
EMPTY_SHA256 = hashlib.sha256(b'').hexdigest()  # of the empty file standing in for a final checkpoint
UNTESTABLE_LOG = 'Traceback (most recent call last):\nValueError: the test of a diverged checkpoint\n'
CPU = 'AMD EPYC (AVX512)'
COMMIT = '8641aba33594'


def as_read(value):
    """A percent AP as the records give it back: written as a fraction, read times 100."""
    return 100 * (value / 100)


def sign_flip_p(d):
    """Exact two-sided sign-flip p by enumerating every sign pattern."""
    d = np.asarray(d, dtype=np.float64)
    flips = np.array(list(itertools.product((1, -1), repeat=len(d)))) @ d
    return float(np.mean(np.abs(flips) >= abs(d.sum()) - 1e-9))


def t_interval(d):
    """The 95 % t interval of the mean of ``d`` (scipy, float64)."""
    d = np.asarray(d, dtype=np.float64)
    return stats.t.interval(0.95, len(d) - 1, loc=d.mean(), scale=stats.sem(d))


def write_record(suite, root, variant, lr, seed, cpu=CPU, held_out=True, checkpoint_sha256='0' * 64):
    """The cell's suite_cell.json as the runner writes it (a reported cell's with the held-out test options), with
    the SHA-256 of the checkpoint a test ended on (None: no test ended)."""
    cell = make_cell(suite, variant, lr, seed, str(root), [])
    record = dict(config={}, options=list(cell.options), seed=seed, lr=lr, version='0.1.0', inputs={})
    if seed in suite.seeds and held_out:
        record['test_options'] = list(suite.held_out)
    write_fingerprint(cell, record, commit=COMMIT, wall_s=1200.0, cpu=cpu, checkpoint_sha256=checkpoint_sha256)


def selection_ap(variant, lr, seed, best):
    """Selection-seed AP (percent) peaking at the arm's ``best`` rate."""
    return 20.0 + (8.0 if lr == best[variant] else 1000 * lr) + 0.5 * seed


def arm_changes(default, **arms):
    """{arm: per-seed validation changes over the gate}: ``default`` for every arm but those given as a=, b=, d=."""
    return {A: default, B: default, D: default, **{dict(a=A, b=B, d=D)[key]: value for key, value in arms.items()}}


def answer_of(suite, root, rule):
    """The answer under ``rule`` of the records written under ``root``, gathered as the tool gathers them."""
    return answer(suite, gather_cells(suite, str(root)), rule)


def final_checkpoint(root, variant, lr, seed, last_epoch):
    """The checkpoint a cell's training ends with, in its work dir under ``root``."""
    return osp.join(str(root), variant, f'lr{lr:g}', f'seed{seed}', f'epoch_{last_epoch}.pth')


def write_study(suite, root, b_minus_a, d_minus_a, changes, epochs, gate_epochs, best=None, cpus=None, untested=(),
                not_held_out=(), skip_selection=(), diverged=()):
    """Records of the study under ``root``: every selection cell (each arm best at ``best[arm]``, 1e-3 by
    default; the extension rate, twice the grid's top, runs where an arm is best at the top), the reported cells at
    the best rates with test AP A + difference (``b_minus_a``, ``d_minus_a``: one per reported seed) and a
    validation at each of ``epochs`` rising to the last, which is AP(``gate_epochs[0]``) + ``changes[arm][i]``.
    ``cpus``: {(arm, seed): CPU kind}; ``untested``, ``not_held_out``: (arm, seed) whose test never ran (no test
    ended: the record holds no checkpoint SHA-256), or whose record lacks the held-out options; ``skip_selection``:
    (arm, lr, seed) selection cells left out; ``diverged``: (arm, seed) whose loss went non-finite, their training
    ended (the final checkpoint written) and their test ended without a result (its test.log a traceback, the record
    the checkpoint's SHA-256), or never ran where the cell is also ``untested``.
    Returns the test APs and validations written, {arm: {seed: AP}} and {arm: {seed: {epoch: AP}}}."""
    best = {A: 1e-3, B: 1e-3, D: 1e-3, **(best or {})}
    last = epochs[-1]
    for variant in (A, B, D):
        top = max(suite.variants[variant].lrs)
        lrs = suite.variants[variant].lrs + ([2 * top] if best[variant] in (top, 2 * top) else [])
        for lr, seed in itertools.product(lrs, suite.selection_seeds):
            if (variant, lr, seed) in skip_selection:
                continue
            ap = selection_ap(variant, lr, seed, best)
            write_cell(str(root), variant, lr, seed, ap / 100, ap / 200, [2.0, 1.5, 1.0],
                       validations={epoch: ap * epoch / (100 * last) for epoch in epochs})
            write_record(suite, root, variant, lr, seed)
    base = {seed: 25.0 + 0.7 * (seed * 7 % 5) for seed in suite.seeds}
    test = {A: base, B: {s: base[s] + d for s, d in zip(suite.seeds, b_minus_a)},
            D: {s: base[s] + d for s, d in zip(suite.seeds, d_minus_a)}}
    validation = {}
    for variant in (A, B, D):
        for i, seed in enumerate(suite.seeds):
            curve = {epoch: test[variant][seed] * epoch / last for epoch in epochs[:-1]}
            curve[last] = curve[gate_epochs[0]] + changes[variant][i]
            validation.setdefault(variant, {})[seed] = curve
            losses = [2.0, math.nan, math.nan] if (variant, seed) in diverged else [2.0, 1.5, 1.0]
            bbox = None if (variant, seed) in untested or (variant, seed) in diverged else test[variant][seed] / 100
            segm = None if bbox is None else 0.8 * bbox  # not the endpoint
            write_cell(str(root), variant, best[variant], seed, bbox, segm, losses,
                       validations={epoch: value / 100 for epoch, value in curve.items()})
            digest = None if (variant, seed) in untested else '0' * 64
            if (variant, seed) in diverged:
                checkpoint = final_checkpoint(root, variant, best[variant], seed, last)
                open(checkpoint, 'w').close()
                if digest:
                    digest = EMPTY_SHA256
                    with open(osp.join(osp.dirname(checkpoint), 'test.log'), 'w') as f:
                        f.write(UNTESTABLE_LOG)
            write_record(suite, root, variant, best[variant], seed, cpu=(cpus or {}).get((variant, seed), CPU),
                         held_out=(variant, seed) not in not_held_out, checkpoint_sha256=digest)
    return test, validation
