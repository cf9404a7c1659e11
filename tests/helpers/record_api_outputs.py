"""Record the SHA-256 of what the conditioning's public API returns, for every combination of its options, so that a
change that should not move a bit can be checked against a record taken before it.

    OMP_NUM_THREADS=1 PYTHONPATH=$PWD:$PWD/tests python -m helpers.record_api_outputs OUT.json [--compare BEFORE.json]

Runs the functional API (condition_tokens on (B, N, d) tokens and on grids, condition_token_windows,
condition_valid_regions whole and per window, with the gradient where C is not a constant), TokenConditioner (called
without a grid, with one, and with valid sizes) and the four modules that own a conditioner (CondSwinTransformer,
CondViT, CondTokBackbone, CondTokNeck) on fixed seeded inputs, for every mode x implementation x solver x detach x
centred (functional), mode x implementation x solver x scope x control x position (TokenConditioner) and scope x
position x control x mode (owners). A refused combination is recorded as the type of its error.

Cases are named with the option names the record was first taken with (``method`` for the implementation);
:func:`spelled` writes a case's options in the names of the code being run. Float results depend on the CPU kind and
the thread count, so the record is a check to rerun on one machine, not a test.
"""
import argparse
import hashlib
import itertools
import json
import platform
import sys

import torch
from mmengine.registry import init_default_scope

import condtok_mm  # noqa: F401  (registers the modules)
from condtok_mm.conditioning import condition_token_windows, condition_tokens, condition_valid_regions
from condtok_mm.models.valid_region import record_valid_region
from condtok_mm.registry import MODELS

MODES = ('sigma_max', 'floor', 'graying', 'graying_dct')
METHODS = ('batched', 'gram', 'svd')
SOLVERS = ('auto', 'eigh', 'newton_schulz')
CONTROLS = (None, 'scale_matched', 'norm_matched')
SCOPES = ('image', 'window')
POSITIONS = ('embedding', 'attention_input')


def spelled(options: dict) -> dict:
    """A case's options (in the names the record was first taken with) in the names of the code being run: the
    implementation was two options, ``method`` ('batched', 'gram', 'svd') and ``solver`` ('auto', 'eigh',
    'newton_schulz', the batched path's), and is one now, ``solver``: method='batched' keeps the solver given,
    'gram' is solver='reference_gram', 'svd' solver='reference_svd'. A reference method with a solver other than
    'auto' was refused (a ValueError) and has no spelling now: it is refused here the same way."""
    options = dict(options)
    method = options.pop('method', 'batched')
    if method != 'batched':
        if options.get('solver', 'auto') != 'auto':
            raise ValueError(f'method={method!r} with solver={options["solver"]!r} has no spelling with one option')
        options['solver'] = dict(gram='reference_gram', svd='reference_svd')[method]
    return options


def digest(value) -> str:
    """SHA-256 of a tensor's dtype, shape and bytes (of each tensor of a tuple or list, in order)."""
    tensors = value if isinstance(value, (tuple, list)) else (value, )
    sha = hashlib.sha256()
    for tensor in tensors:
        tensor = tensor.detach().cpu().contiguous()
        sha.update(f'{tensor.dtype} {tuple(tensor.shape)}'.encode())
        sha.update(tensor.numpy().tobytes())
    return sha.hexdigest()


def outcome(run) -> str:
    """The digest of ``run()``, or the type of the error it raises."""
    try:
        return digest(run())
    except Exception as error:  # a refused combination: its error type is the record
        return type(error).__name__


def tokens(seed: int, shape, rank=None, requires_grad=False) -> torch.Tensor:
    """Seeded float32 tokens of ``shape`` (..., d), of rank ``rank`` over their last two axes when given."""
    gen = torch.Generator().manual_seed(seed)
    if rank is None:
        x = torch.randn(shape, generator=gen)
    else:
        rows = torch.Size(shape[:-1]).numel() // shape[0]
        x = (torch.randn(shape[0], rows, rank, generator=gen) @ torch.randn(shape[0], rank, shape[-1], generator=gen)
             ).view(shape)
    return x.requires_grad_(requires_grad)


def with_gradient(call, x: torch.Tensor, differentiable: bool):
    """(out, d sum(out * w) / dx) where C is differentiable, else out."""
    out = call(x)
    if not differentiable:
        return out
    weight = torch.linspace(-1, 1, out.numel()).view(out.shape)
    (grad, ) = torch.autograd.grad((out * weight).sum(), x)
    return out, grad


def functional_cases(record: dict) -> None:
    """The functional API over mode x method x solver x detach x centred (and a few strengths)."""
    for mode, method, solver, detach, centred in itertools.product(MODES, METHODS, SOLVERS, (True, False),
                                                                    (False, True)):
        options = dict(mode=mode, method=method, solver=solver, detach=detach, centred=centred)
        name = ','.join(f'{key}={value}' for key, value in options.items())
        differentiable = not detach
        calls = dict(
            tokens=lambda x: condition_tokens(x, **spelled(options)),
            grid=lambda x: condition_tokens(x.view(2, 9, 8, 8), **spelled(options)),
            windows=lambda x: condition_token_windows(x, (9, 8), 4, 2, **spelled(options)),
            valid=lambda x: condition_valid_regions(x.view(2, 9, 8, 8), [(9, 8), (5, 3)], **spelled(options)),
            valid_windows=lambda x: condition_valid_regions(x.view(2, 9, 8, 8), [(9, 8), (5, 3)], window_size=4,
                                                            shift_size=2, **spelled(options)))
        for seed, (call_name, call) in enumerate(calls.items()):
            shape, rank = ((2, 30, 8), None) if call_name == 'tokens' else ((2, 72, 8), 3)
            x = tokens(seed, shape, rank, requires_grad=differentiable)
            record[f'functional/{call_name}/{name}'] = outcome(lambda: with_gradient(call, x, differentiable))
    for strength in (dict(alpha=0.5), dict(target_kappa=3.0), dict(mode='graying', epsilon=0.5),
                     dict(alpha=torch.tensor(0.25, dtype=torch.float64)), dict(check=False),
                     dict(method='gram', check=False), dict(method='gram', check=True)):
        name = ','.join(f'{key}={float(value) if torch.is_tensor(value) else value}'
                        for key, value in strength.items())
        x = tokens(7, (2, 72, 8), 3)
        record[f'functional/strength/{name}'] = outcome(lambda: condition_tokens(x.view(2, 9, 8, 8),
                                                                                 **spelled(strength)))


def conditioner_cases(record: dict) -> None:
    """TokenConditioner over mode x method x solver x scope x control x position, called three ways."""
    for mode, method, solver, scope, control, position in itertools.product(MODES, METHODS, SOLVERS, SCOPES,
                                                                            CONTROLS, POSITIONS):
        options = dict(mode=mode, method=method, solver=solver, scope=scope, control=control, position=position)
        name = ','.join(f'{key}={value}' for key, value in options.items())
        window = dict(window_size=4, shift_size=2) if scope == 'window' else {}
        try:
            conditioner = MODELS.build(dict(type='TokenConditioner', **spelled(options), **window))
        except Exception as error:
            record[f'conditioner/build/{name}'] = type(error).__name__
            continue
        x = tokens(11, (2, 72, 8), 3)
        sizes = torch.tensor([[9, 8], [5, 3]])
        record[f'conditioner/tokens/{name}'] = outcome(lambda: conditioner(x))
        record[f'conditioner/grid/{name}'] = outcome(lambda: conditioner(x, (9, 8)))
        record[f'conditioner/valid/{name}'] = outcome(lambda: conditioner(x, (9, 8), sizes))


SWIN = dict(embed_dims=8, depths=(1, 1), num_heads=(1, 1), window_size=2, strides=(4, 2), out_indices=(0, 1),
            pretrain_img_size=32)
VIT = dict(img_size=32, patch_size=4, embed_dim=16, depth=2, num_heads=2, window_size=2, window_block_indexes=(0, ),
           pretrain_img_size=32)
FPN = dict(type='mmdet.FPN', in_channels=[8, 16], out_channels=8, num_outs=2)


def owners(conditioning: dict) -> dict:
    """(name, build, inputs) of each owner of a conditioner with ``conditioning``."""
    return dict(
        swin=lambda: MODELS.build(dict(type='CondSwinTransformer', conditioning=conditioning, condition_stages=(0, 1),
                                       **SWIN)),
        vit=lambda: MODELS.build(dict(type='CondViT', conditioning=conditioning, **VIT)),
        vit_after_pos=lambda: MODELS.build(dict(type='CondViT', conditioning=conditioning,
                                                condition_after_pos_embed=True, **VIT)),
        backbone=lambda: MODELS.build(dict(type='CondTokBackbone', conditioning=conditioning,
                                           backbone=dict(type='mmdet.SwinTransformer', **SWIN))),
        neck=lambda: MODELS.build(dict(type='CondTokNeck', conditioning=conditioning, neck=FPN)))


def owner_inputs(owner: str):
    """Seeded inputs of an owner: images (2, 3, 32, 32), or the neck's two feature maps."""
    if owner == 'neck':
        return (tokens(21, (2, 8, 8, 8)), tokens(22, (2, 16, 4, 4))),
    return tokens(23, (2, 3, 32, 32)),


def owner_cases(record: dict) -> None:
    """The four owners over scope x position x control x mode, on a whole batch and on a padded one."""
    init_default_scope('mmdet')
    for scope, position, control, mode in itertools.product(SCOPES, POSITIONS, CONTROLS, ('sigma_max', 'graying_dct')):
        options = dict(scope=scope, position=position, control=control, mode=mode)
        name = ','.join(f'{key}={value}' for key, value in options.items())
        conditioning = dict(type='TokenConditioner', **spelled(options))
        for owner, build in owners(conditioning).items():
            if owner in ('backbone', 'neck') and scope == 'window':
                conditioning_cfg = dict(conditioning, window_size=2)
                build = owners(conditioning_cfg)[owner]
            torch.manual_seed(5)
            try:
                model = build()
                model.eval()  # mmdet's SwinTransformer.train() returns None: no chaining
            except Exception as error:
                record[f'owner/{owner}/build/{name}'] = type(error).__name__
                continue
            (inputs, ) = owner_inputs(owner)
            with torch.no_grad():
                record[f'owner/{owner}/whole/{name}'] = outcome(lambda: model(inputs))
                if owner != 'neck':  # a batch whose second image is padded; its record dies with it
                    padded = inputs.clone()
                    record_valid_region(padded, [(32, 32), (20, 12)])
                    record[f'owner/{owner}/padded/{name}'] = outcome(lambda: model(padded))
                    del padded


def cpu_model() -> str:
    """The CPU's model name (Linux), on which float results depend."""
    try:
        with open('/proc/cpuinfo') as file:
            return next((line.split(':', 1)[1].strip() for line in file if line.startswith('model name')), '')
    except OSError:
        return ''


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description='SHA-256 of the conditioning API outputs, per option combination')
    parser.add_argument('out', help='the JSON to write')
    parser.add_argument('--compare', help='a record to compare with: prints each case that differs')
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    record = {}
    functional_cases(record)
    conditioner_cases(record)
    owner_cases(record)
    with open(args.out, 'w') as file:
        json.dump(dict(torch=torch.__version__, cpu=platform.processor() or platform.machine(), cpu_model=cpu_model(),
                       cases=record), file, indent=1, sort_keys=True)
    print(f'{len(record)} cases, {sum(len(v) == 64 for v in record.values())} outputs, written to {args.out}')
    if args.compare:
        with open(args.compare) as file:
            before = json.load(file)['cases']
        differ = sorted(key for key in set(before) | set(record) if before.get(key) != record.get(key))
        for key in differ:
            print(f'{key}: {before.get(key)} -> {record.get(key)}')
        print(f'{len(differ)} of {len(set(before) | set(record))} cases differ')
        return 1 if differ else 0
    return 0


if __name__ == '__main__':
    sys.exit(main())
