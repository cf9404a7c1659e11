"""The rows of a suite's report from its cells: one per (seed set, variant, rate), and each variant at its
chosen rate with its paired difference to its reference and, over the suite's family, Holm's correction."""
from .plan import chosen_lr
from .statistics import holm, mean_std, metric_by_seed, paired_difference, reported_metrics


def with_values(by_seed):
    """mean_std of {seed: value} with the values, in seed order."""
    stat = mean_std(list(by_seed.values()))
    return None if stat is None else dict(stat, seeds=sorted(by_seed), values=[by_seed[s] for s in sorted(by_seed)])


def early_loss_by_seed(cells, variant, lr, seeds, first):
    """{seed: mean training loss over iterations 1..first} of the variant's cells at ``lr`` whose loss curve
    reaches iteration ``first`` (a run that stopped before it has no value)."""
    values = {}
    for cell in cells:
        curve = (cell.results or {}).get('loss') or {}
        iters = curve.get('iter') or []
        if cell.variant == variant and cell.lr == lr and cell.seed in seeds and iters and iters[-1] >= first:
            early = [loss for i, loss in zip(iters, curve['value']) if i <= first]
            values[cell.seed] = sum(early) / len(early)
    return values


def seed_set(suite, role):
    return suite.selection_seeds if role == 'selection' else suite.seeds


def row_of(suite, cells, variant, lr, role):
    seeds = seed_set(suite, role)
    group = [cell for cell in cells if cell.variant == variant and cell.lr == lr and cell.seed in seeds]
    done = [cell for cell in group if 'metrics' in cell.results]
    reference = suite.variants[variant].reference
    escapes = {cell.seed: cell.results['escape']['iteration'] for cell in group
               if (cell.results.get('escape') or {}).get('plateau') is not None}  # None: no loss after warm-up
    row = dict(variant=variant, lr=lr, role=role, reference=reference, seeds=sorted(cell.seed for cell in done),
               failed=sorted(cell.seed for cell in group if cell.status == 'failed'),
               escaped=sorted(seed for seed, iteration in escapes.items() if iteration is not None),
               escape_iteration={str(seed): escapes[seed] for seed in sorted(escapes)},
               diverged=sorted(cell.seed for cell in group if cell.results.get('diverged')),
               metrics={}, difference={})
    for key in reported_metrics(suite.metric):
        values = metric_by_seed(cells, variant, lr, key, seeds)
        if values:
            row['metrics'][key] = with_values(values)
            if reference is not None:
                row['difference'][key] = paired_difference(values, metric_by_seed(cells, reference, lr, key, seeds))
    row['final_loss'] = with_values({cell.seed: cell.results['final_loss'] for cell in done
                                     if 'final_loss' in cell.results})
    return row


def chosen_on(suite, variant):
    if variant.best_of:
        return f'best of {variant.best_of}'
    if not variant.tuned:
        return 'fixed'
    return 'selection seeds' if suite.selection_seeds else 'reported seeds'


def aggregate(suite, cells):
    """(rows, chosen): the rows of every (seed set, variant, rate), and each variant at its chosen rate on the
    reported seeds, paired by seed with its reference at the reference's chosen rate."""
    rows = []
    for role in ('selection', 'report'):
        for variant in suite.variants:
            for lr in sorted({cell.lr for cell in cells if cell.variant == variant and suite.role(cell.seed) == role}):
                rows.append(row_of(suite, cells, variant, lr, role))
    chosen = []
    for name, variant in suite.variants.items():
        lr = chosen_lr(suite, cells, name)
        row = next((row for row in rows if (row['variant'], row['lr'], row['role']) == (name, lr, 'report')), None)
        if row is None:
            continue
        reference_lr = chosen_lr(suite, cells, variant.reference) if variant.reference else None
        entry = dict(variant=name, lr=lr, chosen_on=chosen_on(suite, variant), reference=variant.reference,
                     reference_lr=reference_lr, seeds=row['seeds'], metrics=row['metrics'],
                     final_loss=row['final_loss'], escaped=row['escaped'], escape_iteration=row['escape_iteration'],
                     difference={}, p_holm=None)
        if reference_lr is not None:
            for key in row['metrics']:
                entry['difference'][key] = paired_difference(
                    metric_by_seed(cells, name, lr, key, suite.seeds),
                    metric_by_seed(cells, variant.reference, reference_lr, key, suite.seeds))
        if suite.early_loss:
            early = early_loss_by_seed(cells, name, lr, suite.seeds, suite.early_loss)
            entry['early_loss'] = with_values(early)
            entry['early_loss_difference'] = None if reference_lr is None else paired_difference(
                early, early_loss_by_seed(cells, variant.reference, reference_lr, suite.seeds, suite.early_loss))
        chosen.append(entry)
    family = {entry['variant']: entry['difference'][suite.metric]['p'] for entry in chosen
              if entry['variant'] in suite.family and entry['difference'].get(suite.metric)}
    for name, adjusted in holm(family).items():
        next(entry for entry in chosen if entry['variant'] == name)['p_holm'] = adjusted
    return rows, chosen


def validation_rows(suite, cells, chosen):
    """The validations during training of each variant at its chosen rate (reported seeds): per epoch and
    metric, the values and the paired difference to its reference at the reference's chosen rate."""
    def by_seed(variant, lr, key, epoch):
        values = {}
        for cell in cells:
            curve = (cell.results or {}).get('validation', {}).get(key)
            if cell.variant == variant and cell.lr == lr and cell.seed in suite.seeds and curve:
                values.update({cell.seed: value for e, value in zip(curve['epoch'], curve['value']) if e == epoch})
        return values

    rows = []
    for entry in chosen:
        epochs = sorted({e for cell in cells if cell.variant == entry['variant'] and cell.lr == entry['lr']
                         for e in (cell.results or {}).get('validation', {}).get(suite.metric, {}).get('epoch', [])})
        for epoch in epochs:
            values = by_seed(entry['variant'], entry['lr'], suite.metric, epoch)
            row = dict(variant=entry['variant'], lr=entry['lr'], epoch=epoch, metric=with_values(values),
                       difference=None)
            if entry['reference_lr'] is not None:
                row['difference'] = paired_difference(values, by_seed(entry['reference'], entry['reference_lr'],
                                                                      suite.metric, epoch))
            rows.append(row)
    return rows
