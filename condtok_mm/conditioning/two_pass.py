"""Whole images of float32/16 tokens in two passes over X, with no float64 copy of it.

The correction is :func:`.batched.condition_masked`'s (the same G~, M = h(G~) and band term; see :mod:`.batched`),
laid out around its bytes for stacks of more than ACCURATE_ROWS x d token rows:

1. one read of X, in chunks of rows: each chunk cast to float64 and masked in cache, accumulated into
   G = u^T u, and its running sums read off at the band edges that fall in it, whose differences are the band sums
   Z^T u (O(N d), no atomics that could reorder a sum: deterministic);
2. the d x d spectral function: I + alpha M and the band rows alpha rho F^T (I + M);
3. one read of X and one write of the result, in chunks: X (I + alpha M) plus each token's band row, the tokens
   outside the mask as they were, cast back to X's dtype, and the largest magnitude kept for the overflow check.

Three passes over X in float32 units (tools/benchmark/byte_counts.py), where the one-program path makes 33; the
extra memory is the result plus a chunk and a few d x d float64 matrices per image.

Squares of float32/16 values cannot overflow or underflow in float64, so no scale is taken (float64 tokens keep
the one-program path). The chunks run along the token axis for the whole stack at once: the number of launches
grows with the padded length, not with the batch, and is the same for any valid sizes.
"""
import torch

from .batched import _Bands, regularised_function, status_of_largest

# Rows per chunk times channels, per token matrix (a chunk spans the whole stack, so it is S times this; sized per
# matrix so that the launches do not grow with the batch). On the CPU 1 MiB of float64, so that a chunk's float64
# copies stay in cache at small batches; on CUDA 32 MiB, because there each chunk's dozen kernel launches cost more
# than its bytes (Swin-T's first stage, 67,200 x 96 tokens, is then two chunks; its traffic there is not measured).
CHUNK_ELEMENTS = {'cpu': 2**17, 'cuda': 2**22}
# The rows of the blocks a chunk's running sums are taken in (None: one cumsum along the chunk). CUDA runs a cumsum
# along a non-innermost axis as one sequential loop over that axis per (matrix, channel), tens of thousands of
# dependent steps on a Swin-T chunk; in blocks, inside each and then over the blocks' totals (recursively), no loop
# is longer than a block. The CPU's cumsum runs along the rows vectorised over the channels, where the blocked
# form took 14x as long on a 1,365-row chunk.
SCAN_BLOCK = {'cpu': None, 'cuda': 64}


def chunk_rows(length: int, channels: int, device: torch.device) -> int:
    """The rows of one chunk of a stack of ``length`` token rows of ``channels`` on ``device``."""
    elements = CHUNK_ELEMENTS.get(device.type, CHUNK_ELEMENTS['cuda'])
    return max(1, min(length, elements // channels))


def condition_two_pass(x: torch.Tensor, mask: torch.Tensor, options):
    """X + C in x's dtype for the stack ``x`` (S, L, d) of float32/16 tokens (L >= d), x itself outside ``mask``
    (S, L), and the status (S,) of each matrix (FINE, BAD_INPUT where X has NaN/Inf, BAD_OUTPUT where X + C
    overflows x's dtype), for ``options`` (a :class:`.options.ConditioningOptions`) of mode 'sigma_max' or
    'floor' on the batched path."""
    stack, length, d = x.shape
    rows = chunk_rows(length, d, x.device)
    spans = [(start, min(start + rows, length)) for start in range(0, length, rows)]
    bands = _Bands(mask, d)
    outside = ~mask.unsqueeze(-1)
    gram = torch.zeros(stack, d, d, dtype=torch.float64, device=x.device)
    edge_sums = _EdgeSums(bands.ends, rows, d)
    for start, end in spans:
        chunk = x[:, start:end].to(torch.float64, copy=True).masked_fill_(outside[:, start:end], 0)
        gram.baddbmm_(chunk.transpose(1, 2), chunk)
        edge_sums.add(chunk, start, end)
    finite = torch.isfinite(gram.diagonal(dim1=-2, dim2=-1)).all(-1)  # NaN/Inf always reach the diagonal
    zero = torch.zeros((), dtype=torch.float64, device=x.device)
    gram = torch.where(finite[:, None, None], gram, zero)
    prefix = edge_sums.prefix  # the sums of u over the positions before each band edge
    zu = torch.where(finite[:, None, None], (prefix[:, 1:] - prefix[:, :-1]) * bands.weight.unsqueeze(-1), zero)
    m_matrix, band_rows = regularised_function(gram, zu, bands, mask.sum(-1), options)
    transform = torch.eye(d, dtype=torch.float64, device=x.device) + options.alpha * m_matrix
    # each token's band row, Z's weight included; row d of each matrix (no band) is zero
    table = torch.nn.functional.pad(band_rows * bands.weight.unsqueeze(-1), (0, 0, 0, 1)).reshape(-1, d)
    token_rows = bands.rows.view(stack, length)
    out = torch.empty_like(x)
    largest = torch.zeros(stack, dtype=torch.float64, device=x.device)
    for start, end in spans:
        tokens = x[:, start:end].to(torch.float64, copy=True)  # the one read of X in this pass
        chunk_outside = outside[:, start:end]
        conditioned = table.index_select(0, token_rows[:, start:end].reshape(-1)).view(stack, end - start, d)
        # X (I + alpha M) + the band rows (alpha = 0: 0 + X I, exactly X), zero outside the mask
        conditioned.baddbmm_(tokens.masked_fill(chunk_outside, 0), transform).masked_fill_(chunk_outside, 0)
        largest = torch.maximum(largest, torch.linalg.vector_norm(conditioned, ord=float('inf'), dim=(1, 2)))
        # plus X outside the mask (zero inside): X itself there, through float64 and back, exactly
        out[:, start:end] = conditioned.add_(tokens.masked_fill_(~chunk_outside, 0)).to(x.dtype)
    return out, status_of_largest(largest, finite, x.dtype)


def running_sums(x: torch.Tensor, block=None) -> torch.Tensor:
    """x.cumsum(1) for x (S, R, d); with ``block``, taken as prefix sums inside blocks of that many rows plus the sums
    of the blocks before each (themselves running sums over the blocks' totals, recursively): the same sums in
    another fixed order of additions (deterministic), with no sequential loop longer than ``block``."""
    stack, rows, channels = x.shape
    if block is None or rows <= block:
        return x.cumsum(1)
    blocks = -(-rows // block)
    padded = torch.nn.functional.pad(x, (0, 0, 0, blocks * block - rows))
    within = padded.view(stack, blocks, block, channels).cumsum(2)
    before = torch.nn.functional.pad(running_sums(within[:, :-1, -1], block), (0, 0, 1, 0))  # zeros for block 0
    return within.add_(before.unsqueeze(2)).view(stack, blocks * block, channels)[:, :rows]


class _EdgeSums:
    """The sums of u over the positions before each band edge (``ends`` (S, d + 1), non-decreasing positions), from
    chunks of u in order: each chunk's running sums plus the carry of the chunks before it, read at the edges that
    fall in it. A chunk of ``rows`` positions holds at most ``rows`` + 1 edges of live bands (their positions
    increase strictly), so ``rows`` + 1 edges from the first one past the chunk's start are read: O(chunk) per chunk.
    Edges of bands that do not exist (positions repeated at n) may be left out; their bands have weight 0."""

    def __init__(self, ends: torch.Tensor, rows: int, d: int):
        self.ends = ends
        self.window = torch.arange(min(d + 1, rows + 1), device=ends.device)
        self.prefix = torch.zeros(ends.shape[0], d + 1, d, dtype=torch.float64, device=ends.device)
        self.carry = torch.zeros(ends.shape[0], 1, d, dtype=torch.float64, device=ends.device)

    def add(self, chunk: torch.Tensor, start: int, end: int) -> None:
        stack, _, channels = chunk.shape
        last = self.ends.shape[1] - 1
        first = (self.ends <= start).sum(-1, keepdim=True)  # the first edge past the chunk's start
        index = (first + self.window).clamp(max=last)  # (S, window)
        position = self.ends.gather(1, index)
        inside = (position > start) & (position <= end) & (first + self.window <= last)
        running = running_sums(chunk, SCAN_BLOCK.get(chunk.device.type, SCAN_BLOCK['cuda']))
        rows = (position - start - 1).clamp(0, end - start - 1).unsqueeze(-1).expand(-1, -1, channels)
        value = (running.gather(1, rows) + self.carry) * inside.unsqueeze(-1)
        # each edge gets one nonzero value over all chunks (the others add exact zeros): the order cannot matter
        self.prefix.scatter_add_(1, index.unsqueeze(-1).expand(-1, -1, channels), value)
        self.carry = self.carry + running[:, -1:]
