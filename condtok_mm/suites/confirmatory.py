"""The answer of a pre-registered study (a suite whose header declares its decision rule before any cell ran) from
its cells' records, by that rule: each arm's rate as the suite's runner chooses it on the selection seeds; on the
reported seeds the test bbox AP of B - A (primary) and D - A (secondary), paired by seed, Holm-adjusted over that
family, and D - B outside it; each arm's convergence gate (the validation AP change between the rule's gate epochs);
the first of the ordered readings that holds; the test metrics the header describes beside the endpoint and the
validation gaps at every epoch, described; each cell's commit and CPU kind, and the primary without the seeds whose
arms ran on different kinds of CPU, described.

The rule's numbers and words are those of a :class:`ConfirmatoryRule`, one per study in :data:`RULES` (each quotes
its suite's header); every function here takes it as an argument. Nothing is decided until every reported cell has
finished (a test result on the held-out split for every arm and seed, or, where the rule says so, a diverged cell
that the test could not score): until then the answer is "not resolved (incomplete)", with the cells that are
missing, and the tables describe what exists. The records are read as tools/suites/run_suite.py reads them (its
plan, its cell readers, its statistics); nothing else is read or written here.
"""
import dataclasses
import os.path as osp
from typing import Optional, Tuple

from .fingerprint import HELD_OUT_KEY, cell_record
from .plan import STAGES, cells_of_stage, chosen_lr, unfinished_selection
from .report import commits_of, cpus_of
from .results import UnreadableCellFile, cell_results, diverged_untestable
from .schema import phase_of
from .statistics import below, holm, metric_by_seed, paired_difference
from .tables import validation_rows, with_values

INCOMPLETE = 'not resolved (incomplete)'


@dataclasses.dataclass(frozen=True)
class ConfirmatoryRule:
    """The decision rule of one pre-registered suite, as its header declares it (the defaults quote
    configs/suites/demo_confirm_swin.py's; :data:`RULES` holds each study's; a change is a new study).

    Args:
        suite (str): the suite file whose header declares the rule, relative to the checkout.
            Default: 'configs/suites/demo_confirm_swin.py'.
        reference (str): the baseline arm every family comparison is taken against. Default: 'A_baseline'.
        family (tuple[str]): the arms compared with the reference that Holm's adjustment covers, the primary first.
            Default: ('B_conditioned', 'D_norm_matched').
        metric (str): the endpoint, test (and validation) bbox AP. Default: 'coco/bbox_mAP'.
        margin_ap (float): reading 3 needs the interval of an arm's difference to end below it (its header says
            what the gap stands for). Default: 2.0.
        converged_below_ap (float): an arm converged where |mean of AP(last) - AP(first)| over the gate epochs is
            below it. Default: 1.0.
        rising_above_ap (float): an arm is still rising where that change's interval starts above it, whatever
            the gate says. Default: 0.5.
        gate_epochs (tuple[int, int]): the validations the gate compares (first, last). Default: (33, 36).
        alpha (float): readings 1 and 2 need the Holm-adjusted p at most this. Default: 0.05.
        early_epoch (int, optional): the validation whose gap is the early-budget comparison (described, not
            decided); None where the header names none. Default: 12.
        better_text (str): the words of reading 1. Default: 'a better final detector'.
        ahead_text (str): the words of reading 2, formatted with ``arm`` and ``epoch`` (the gate's last).
            Default: '{arm} ahead at {epoch} epochs, the baseline still rising: the final detector not resolved'.
        not_better_text (str): the words of reading 3, formatted with ``margin`` (margin_ap); ' (the baseline ends
            ahead)' is added where the interval ends below 0. Default: 'not a better final detector by {margin} AP
            or more'.
        untestable_diverged_as_zero (bool): whether a reported cell whose loss diverged and whose checkpoint the
            test could not score counts as test AP 0, and its arm as not converged (else it stays missing, as any
            cell without a test result). Default: False.
        described_metrics (tuple[tuple[str, str]]): the test metrics the header describes beside the endpoint, as
            (key of tools/test.py's JSON, label): each arm's per-seed values and the three paired differences,
            uncorrected, deciding nothing (a cell counted as test AP 0 counts 0 in each). Default: ().
    """
    suite: str = 'configs/suites/demo_confirm_swin.py'
    reference: str = 'A_baseline'
    family: Tuple[str, ...] = ('B_conditioned', 'D_norm_matched')
    metric: str = 'coco/bbox_mAP'
    margin_ap: float = 2.0
    converged_below_ap: float = 1.0
    rising_above_ap: float = 0.5
    gate_epochs: Tuple[int, int] = (33, 36)
    alpha: float = 0.05
    early_epoch: Optional[int] = 12
    better_text: str = 'a better final detector'
    ahead_text: str = '{arm} ahead at {epoch} epochs, the baseline still rising: the final detector not resolved'
    not_better_text: str = 'not a better final detector by {margin} AP or more'
    untestable_diverged_as_zero: bool = False
    described_metrics: Tuple[Tuple[str, str], ...] = ()

    @property
    def primary(self):
        """The arm of the primary endpoint (the family's first)."""
        return self.family[0]


# each pre-registered study's rule, by its suite file's stem; the numbers and words quote the suite's header
RULES = {
    'demo_confirm_swin': ConfirmatoryRule(),
    'neon_trees_swin': ConfirmatoryRule(
        suite='configs/suites/neon_trees_swin.py', gate_epochs=(360, 400), early_epoch=None,
        better_text='a better detector on the held-out image',
        ahead_text='{arm} ahead at the end of the schedule, the baseline not settled: not resolved',
        not_better_text='not a better detector by {margin} AP or more', untestable_diverged_as_zero=True,
        described_metrics=(('coco/bbox_mAP_50', 'AP50'), ('coco/bbox_mAP_s', 'small-crown AP (under 32² px)'))),
}


def rule_mismatch(suite, rule):
    """None where the suite is the rule's file (by its name: a copy of the study's checkout is the same study) with
    the rule's arms, reference, family and metric, else what differs (a rule is one study's: another suite needs
    its own, in :data:`RULES`)."""
    if osp.basename(suite.path) != osp.basename(rule.suite):
        return f'the suite is {suite.path}, not {rule.suite}'
    arms = {rule.reference, *rule.family}
    if set(suite.variants) != arms:
        return f'{suite.path} has the arms {sorted(suite.variants)}, the rule {sorted(arms)}'
    if suite.reference != rule.reference or list(suite.family) != list(rule.family) or suite.metric != rule.metric:
        return (f'{suite.path} declares reference {suite.reference!r}, family {suite.family} and metric '
                f'{suite.metric!r}; the rule {rule.reference!r}, {list(rule.family)} and {rule.metric!r}')
    return None


def gather_cells(suite, record_dir, progress=lambda cells: cells):
    """Every cell of ``suite`` that the records in ``record_dir`` (a suite run's --out-dir or its saved records)
    make known, each with its results, stage by stage as the runner plans them: the selection cells, the extension
    rate where the suite extends a best rate at the top of its grid, and the reported cells of each arm whose rate
    is chosen (every selection cell of it finished). ``progress`` wraps each stage's list of cells (a tqdm)."""
    phases = phase_of(suite)
    cells = []
    for phase in range(max(phases.values()) + 1):
        for stage in STAGES:
            new, _ = cells_of_stage(suite, phase, stage, phases, cells, record_dir, [])
            for cell in progress(new) if new else ():
                cell.results = cell_results(cell, suite.escape)
            cells += new
    return cells


def chosen_rates(suite, cells):
    """{arm: dict(lr, waiting, edge, selection)}: the rate the runner reports the arm at (None while ``waiting``
    says which selection cells have not finished), whether that is at the grid's edge ('lowest': its grid's lowest
    rate; 'extension': the rate added above its top), and per rate the selection seeds' metric."""
    rates = {}
    for name, variant in suite.variants.items():
        selection = [cell for cell in cells if cell.variant == name and cell.seed in suite.selection_seeds]
        waiting = unfinished_selection(suite, cells, name)
        lr = None if waiting else chosen_lr(suite, cells, name)
        edge = None
        if lr is not None and lr == min(variant.lrs):
            edge = 'lowest'
        elif lr is not None and suite.extend_top and lr == 2 * max(variant.lrs):
            edge = 'extension'
        per_rate = [dict(lr=rate, planned=sum(cell.lr == rate for cell in selection),
                         metric=with_values(metric_by_seed(selection, name, rate, suite.metric)))
                    for rate in sorted({cell.lr for cell in selection})]
        rates[name] = dict(lr=lr, waiting=waiting, edge=edge, selection=per_rate)
    return rates


def reported_record_problem(suite, cell, record):
    """What in a reported cell's suite_cell.json keeps its test result out of the answer, or None: no record, a
    record of another cell, or one without the held-out test options (its test read other images)."""
    if record is None:
        return 'no suite_cell.json: which cell and which test images it had is not known'
    if (record.get('variant'), record.get('seed'), record.get('lr')) != (cell.variant, cell.seed, cell.lr):
        return (f"its suite_cell.json is that of {record.get('variant')} lr {record.get('lr')} seed "
                f"{record.get('seed')}")
    if record.get(HELD_OUT_KEY) != list(suite.held_out):
        return (f'its suite_cell.json does not record the held-out test split ({HELD_OUT_KEY}: '
                f'{record.get(HELD_OUT_KEY)!r}): its test read other images')
    return None


def counts_as_zero(cell, record, rule):
    """Whether ``rule`` (its untestable_diverged_as_zero) counts a reported ``cell`` without a test result, gathered
    with its results, as test AP 0: its loss diverged and its test ended on its final checkpoint without scoring
    it, as its ``record`` (its suite_cell.json) says (:func:`~condtok_mm.suites.results.diverged_untestable`; saved
    records keep no checkpoint, so the record is the evidence). A cell whose training has not ended, or whose test
    was stopped or never started, does not count: --resume tests it."""
    return rule.untestable_diverged_as_zero and diverged_untestable(cell.results or {}, record)


def reported_cells(suite, cells, rates, rule):
    """(finished, zeroed, records, missing) of the reported seeds: the cells with a test metric and a record that
    says they were tested on the held-out split; the cells with such a record and no test result that the rule
    counts as test AP 0 (:func:`counts_as_zero`); {(arm, seed): their suite_cell.json}, of both; one
    dict(variant, lr, seed, why) for every arm and reported seed without either, in seed order."""
    finished, zeroed, records, missing = [], [], {}, []
    for seed in suite.seeds:
        for name in suite.variants:
            lr = rates[name]['lr']
            if lr is None:
                missing.append(dict(variant=name, lr=None, seed=seed,
                                    why=f'no rate chosen yet: {rates[name]["waiting"]}'))
                continue
            cell = next(c for c in cells if (c.variant, c.lr, c.seed) == (name, lr, seed))
            results = cell.results or {}
            try:
                record = cell_record(cell)
            except UnreadableCellFile as error:
                record, why = None, str(error)
            else:
                why = reported_record_problem(suite, cell, record)
            if 'unreadable' in results:
                why = results['unreadable']
            elif rule.metric not in results.get('metrics', {}):
                if not why and counts_as_zero(cell, record, rule):
                    zeroed.append(cell)
                    records[name, seed] = record
                    continue
                why = 'no test result (not run, or not finished)'
            if why:
                missing.append(dict(variant=name, lr=lr, seed=seed, why=why))
            else:
                finished.append(cell)
                records[name, seed] = record
    return finished, zeroed, records, missing


def validation_by_seed(rows):
    """{arm: {epoch: {seed: value}}} of :func:`~condtok_mm.suites.tables.validation_rows`."""
    curves = {}
    for row in rows:
        values = row['metric'] or dict(seeds=[], values=[])
        curves.setdefault(row['variant'], {})[row['epoch']] = dict(zip(values['seeds'], values['values']))
    return curves


def convergence_gate(curve, seeds, rule, diverged=()):
    """The gate of one arm from its validations ``curve`` ({epoch: {seed: AP}}): the paired change between the
    rule's gate epochs over the reported ``seeds`` (mean, 95 % t interval), converged where every seed has both,
    |mean| < converged_below_ap (a mean that equals it in exact arithmetic is not below it:
    :func:`~condtok_mm.suites.statistics.below`) and no seed is in ``diverged`` (the arm's seeds counted as test AP
    0), rising where the interval's low end is above rising_above_ap; None without a seed that has both."""
    before, after = ({s: v for s, v in curve.get(epoch, {}).items() if s in seeds} for epoch in rule.gate_epochs)
    change = paired_difference(after, before)
    if change is None:
        return None
    complete = change['seeds'] == sorted(seeds)
    scale = max(abs(value) for values in (before, after) for value in values.values())
    converged = complete and not diverged and below(abs(change['mean']), rule.converged_below_ap, scale)
    return dict(change, complete=complete, converged=converged,
                rising=change['low'] is not None and change['low'] > rule.rising_above_ap)


def settled(gate):
    """Converged and not rising."""
    return gate is not None and gate['converged'] and not gate['rising']


def reading_text(number, arm, difference, rule):
    """The words of reading ``number`` for ``arm`` (its difference to the reference: reading 3 says "the baseline
    ends ahead" where the interval ends below 0), the rule's."""
    if number == 1:
        return rule.better_text
    if number == 2:
        return rule.ahead_text.format(arm=arm, epoch=rule.gate_epochs[1])
    if number == 3:
        text = rule.not_better_text.format(margin=f'{rule.margin_ap:g}')
        return text + ' (the baseline ends ahead)' if difference['high'] < 0 else text
    return 'not resolved'


def reading(arm, difference, p_holm, reference_gate, arm_gate, rule):
    """The first of the declared readings that holds on the arm's difference to the reference (its unadjusted
    interval [low, high]) and Holm-adjusted p: dict(number, text).

        1  low > 0 and p <= alpha, and the reference converged and not rising
        2  low > 0 and p <= alpha
        3  high < margin_ap, and the reference and the arm both converged and not rising
        4  anything else
    """
    low, high = difference['low'], difference['high']
    ahead = low is not None and low > 0 and p_holm is not None and p_holm <= rule.alpha
    if ahead and settled(reference_gate):
        number = 1
    elif ahead:
        number = 2
    elif high is not None and high < rule.margin_ap and settled(reference_gate) and settled(arm_gate):
        number = 3
    else:
        number = 4
    return dict(number=number, text=reading_text(number, arm, difference, rule))


def machines(suite, records):
    """Each reported cell's commit and CPU kind, how many cells ran at each, the seeds whose arms (all finished)
    did not share one CPU kind (a CPU not recorded shares none), and the seeds whose arms have all finished."""
    cells = [dict(variant=name, seed=seed, lr=record.get('lr'), commit=record.get('commit'), cpu=record.get('cpu'),
                  checkpoint_sha256=record.get('checkpoint_sha256'), wall_s=record.get('wall_s'))
             for (name, seed), record in sorted(records.items(), key=lambda item: (item[0][1], item[0][0]))]
    whole = [seed for seed in suite.seeds if all((name, seed) in records for name in suite.variants)]
    mixed = [seed for seed in whole if len({records[name, seed].get('cpu') for name in suite.variants}) > 1
             or any(records[name, seed].get('cpu') is None for name in suite.variants)]
    return dict(cells=cells, whole_seeds=whole, mixed_seeds=mixed, commits=commits_of(records.values()),
                cpus=cpus_of(records.values()))


def reported_values(key, finished, rates, zero_seeds):
    """{arm: {seed: value}} of the test metric ``key`` on the reported cells: the ``finished`` cells at each arm's
    chosen rate (``rates``), and 0 for the arm's seeds counted as test AP 0 (``zero_seeds``)."""
    return {name: {**metric_by_seed(finished, name, rate['lr'], key), **dict.fromkeys(zero_seeds[name], 0.0)}
            for name, rate in rates.items()}


def described_metric(key, label, finished, rates, zero_seeds, rule):
    """One of the rule's described test metrics on the reported cells (:func:`reported_values`): each arm's values
    and the comparisons of :func:`paired_comparisons`, without Holm's adjustment (described, not decided on)."""
    values = reported_values(key, finished, rates, zero_seeds)
    return dict(metric=key, label=label, arms={name: with_values(by_seed) for name, by_seed in values.items()},
                comparisons=paired_comparisons(values, rule))


def paired_comparisons(test, rule):
    """The comparisons of a test metric (``test``: {arm: {seed: value}}), paired by seed: each arm of the family
    against the reference, then its last arm against its first (D - B), outside the family; no p is adjusted
    (p_holm None)."""
    comparisons = [dict(arm=name, reference=rule.reference, in_family=True,
                        difference=paired_difference(test[name], test[rule.reference])) for name in rule.family]
    comparisons.append(dict(arm=rule.family[-1], reference=rule.primary, in_family=False,
                            difference=paired_difference(test[rule.family[-1]], test[rule.primary])))
    return [dict(comparison, p_holm=None) for comparison in comparisons]


def family_comparisons(test, rule):
    """:func:`paired_comparisons` of the endpoint, each in the family with its Holm-adjusted p over the family (the
    one outside it with none)."""
    comparisons = paired_comparisons(test, rule)
    adjusted = holm({c['arm']: c['difference']['p'] for c in comparisons
                     if c['in_family'] and c['difference'] and c['difference']['p'] is not None})
    return [dict(comparison, p_holm=adjusted.get(comparison['arm']) if comparison['in_family'] else None)
            for comparison in comparisons]


def answer(suite, cells, rule):
    """The study's answer from its gathered ``cells`` (:func:`gather_cells`) under ``rule``
    (:class:`ConfirmatoryRule`): a JSON-ready dict with the rates, the reported cells (finished, counted as test
    AP 0, missing), each arm's test metric and gate, the comparisons (difference, Holm p), the readings (INCOMPLETE
    until every reported cell has finished), the validation gaps and the machines. Raises ValueError where the
    suite is not the rule's."""
    mismatch = rule_mismatch(suite, rule)
    if mismatch:
        raise ValueError(f'the rule is that of {rule.suite}: {mismatch}')
    rates = chosen_rates(suite, cells)
    finished, zeroed, records, missing = reported_cells(suite, cells, rates, rule)
    expected = len(suite.variants) * len(suite.seeds)
    zero_seeds = {name: sorted(cell.seed for cell in zeroed if cell.variant == name) for name in suite.variants}
    test = reported_values(rule.metric, finished, rates, zero_seeds)
    chosen = [dict(variant=name, lr=rates[name]['lr'], reference=suite.variants[name].reference,
                   reference_lr=rates[suite.variants[name].reference]['lr'] if suite.variants[name].reference
                   else None) for name in suite.variants if rates[name]['lr'] is not None]
    rows = validation_rows(suite, finished + zeroed, chosen)
    curves = validation_by_seed(rows)
    gates = {name: convergence_gate(curves.get(name, {}), suite.seeds, rule, zero_seeds[name])
             for name in suite.variants}
    comparisons = family_comparisons(test, rule)
    complete = not missing
    readings = {}
    for comparison in comparisons[:len(rule.family)]:
        name = comparison['arm']
        readings[name] = reading(name, comparison['difference'], comparison['p_holm'], gates[rule.reference],
                                 gates[name], rule) if complete else dict(number=None, text=INCOMPLETE)
    machine = machines(suite, records)
    kept = [seed for seed in machine['whole_seeds'] if seed not in machine['mixed_seeds']]
    machine['primary_without_mixed'] = paired_difference(
        {s: v for s, v in test[rule.primary].items() if s in kept},
        {s: v for s, v in test[rule.reference].items() if s in kept}) if machine['mixed_seeds'] else None
    described = [described_metric(key, label, finished, rates, zero_seeds, rule)
                 for key, label in rule.described_metrics]
    gaps = [dict(arm=row['variant'], epoch=row['epoch'], early_budget=row['epoch'] == rule.early_epoch,
                 difference=row['difference']) for row in rows if row['difference'] is not None]
    return dict(suite=suite.path, rule=dataclasses.asdict(rule), seeds=suite.seeds,
                selection_seeds=suite.selection_seeds, complete=complete, finished=len(finished) + len(zeroed),
                expected=expected, missing=missing, rates=rates,
                arms={name: dict(lr=rates[name]['lr'], test=with_values(test[name]), gate=gates[name],
                                 diverged=sorted(cell.seed for cell in finished
                                                 if cell.variant == name and cell.results.get('diverged')),
                                 counted_as_zero=zero_seeds[name],
                                 validation=[dict(epoch=epoch, **with_values(values))
                                             for epoch, values in sorted(curves.get(name, {}).items()) if values])
                      for name in suite.variants},
                comparisons=comparisons, readings=readings, described=described, validation_gaps=gaps,
                machines=machine)
