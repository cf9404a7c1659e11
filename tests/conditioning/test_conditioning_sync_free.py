"""The batched path's GPU properties, checked on the CPU: one program for the whole padded batch, without host
reads.

Public API only: TokenConditioner()(tokens, hw_shape=(24, 40), valid_shapes=...) on LayerNorm'd patch embeddings,
each image of the batch padded differently.
"""
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from condtok_mm.models.token_conditioner import TokenConditioner

HOST_READS = {'_local_scalar_dense', 'nonzero', 'masked_select', 'unique', '_unique', '_unique2', 'unique_dim',
              'unique_consecutive', 'item', 'equal', 'is_nonzero', 'allclose', '_assert_async'}


def padded_batch(batch, seed=0):
    gen = torch.Generator().manual_seed(seed)
    tokens = torch.nn.functional.layer_norm(torch.randn(batch, 24 * 40, 96, generator=gen), (96, ))
    sizes = torch.tensor([[24 - 3 * (b % 5), 40 - 7 * (b % 4)] for b in range(batch)])
    return tokens, sizes


class CountOps(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += 1
        return func(*args, **(kwargs or {}))


class RefuseHostReads(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if name in HOST_READS:
            raise AssertionError(f'host read: aten.{name}')
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize('options', [dict(), dict(solver='newton_schulz'), dict(scope='window', window_size=7),
                                     dict(centred=True), dict(control='norm_matched'), dict(mode='floor'),
                                     dict(mode='graying_dct')])
@pytest.mark.slow
def test_op_count_does_not_grow_with_the_batch(options):
    conditioner = TokenConditioner(**options)
    counts = []
    for batch in (2, 8):
        tokens, sizes = padded_batch(batch)
        with CountOps() as mode:
            conditioner(tokens, hw_shape=(24, 40), valid_shapes=sizes)
        counts.append(mode.count)
    assert counts[0] == counts[1], counts


@pytest.mark.slow
def test_op_count_with_valid_shapes_as_a_list_is_the_same_for_every_batch():
    conditioner = TokenConditioner()
    counts = []
    for batch in (2, 8):
        tokens, sizes = padded_batch(batch)
        with CountOps() as mode:
            conditioner(tokens, hw_shape=(24, 40), valid_shapes=[tuple(s) for s in sizes.tolist()])
        counts.append(mode.count)
    assert counts[0] == counts[1], counts


@pytest.mark.parametrize('options', [dict(), dict(scope='window', window_size=7, shift_size=3),
                                     dict(centred=True, control='scale_matched'), dict(mode='graying_dct')])
@pytest.mark.slow
def test_the_gpu_path_runs_without_host_reads(options):
    # the default GPU path: Newton-Schulz (sigma_max); check='auto' on CUDA copies the status without a read
    # (deferred), which check=False stands in for on the CPU
    options = dict(dict(solver='newton_schulz') if options.get('mode') is None else {}, **options)
    conditioner = TokenConditioner(check=False, **options)
    tokens, sizes = padded_batch(3)
    with RefuseHostReads():
        out = conditioner(tokens, hw_shape=(24, 40), valid_shapes=sizes)
    assert torch.isfinite(out).all()


def test_host_read_guard_catches_the_cpu_check():
    # the guard is live: the CPU's immediate finiteness check reads the status back and is refused
    tokens, sizes = padded_batch(2)
    with pytest.raises(AssertionError, match='host read: aten._local_scalar_dense'):
        with RefuseHostReads():
            TokenConditioner(solver='newton_schulz')(tokens, hw_shape=(24, 40), valid_shapes=sizes)


@pytest.mark.parametrize('options', [dict(solver='eigh'), dict(solver='newton_schulz'), dict(mode='graying_dct')])
@pytest.mark.slow
def test_compiles_whole_and_other_valid_sizes_do_not_recompile(options):
    import torch._dynamo
    torch._dynamo.reset()
    conditioner = TokenConditioner(check=False, **options)
    tokens, sizes = padded_batch(2)
    explanation = torch._dynamo.explain(conditioner)(tokens, hw_shape=(24, 40), valid_shapes=sizes)
    assert explanation.graph_break_count == 0 and explanation.graph_count == 1, explanation.break_reasons
    torch._dynamo.reset()
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    compiled = torch.compile(conditioner, backend=backend, fullgraph=True)
    first = compiled(tokens, hw_shape=(24, 40), valid_shapes=sizes)
    torch.testing.assert_close(first, conditioner(tokens, hw_shape=(24, 40), valid_shapes=sizes))
    other_tokens, _ = padded_batch(2, seed=1)
    compiled(other_tokens, hw_shape=(24, 40), valid_shapes=torch.tensor([[5, 9], [24, 1]]))
    assert len(graphs) == 1  # other valid sizes: the same graph
    # a strength ramp between iterations (conditioner.alpha = ...): the same graph
    for alpha in (0.5, 0.75, 1.0, 0.0):
        conditioner.alpha = alpha
        out = compiled(other_tokens, hw_shape=(24, 40), valid_shapes=torch.tensor([[17, 33], [0, 0]]))
        torch.testing.assert_close(out, conditioner(other_tokens, hw_shape=(24, 40),
                                                    valid_shapes=torch.tensor([[17, 33], [0, 0]])))
    assert len(graphs) == 1
    torch._dynamo.reset()
