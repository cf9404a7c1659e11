"""Conditioned embedded tokens: the correction that bounds kappa of a token matrix.

Pure PyTorch, no OpenMMLab imports. Reference: H. Saratchandran and S. Lucey, "Enhancing Transformers
Through Conditioned Embedded Tokens", ICCV 2025 (arXiv 2505.12789).

For one image, X is the N x d matrix of embedded tokens, with thin SVD X = U S V^T, singular values
s_1 >= ... >= s_r >= 0 (r = min(N, d)) and condition number kappa(X) = s_1 / s_r. A correction C moves
every singular value up while keeping the singular vectors:

    X + C = U (S + D) V^T,   C = U D V^T,   D = alpha * diag(g(s_i))

``mode='sigma_max'`` (the paper's construction):  g(s_i) = s_1 / (t - 1)
    With t = target_kappa = 2 this is C = s_1 U V^T and the singular values land in [s_1, 2 s_1].
``mode='floor'``:  g(s_i) = max(s_1 / t - s_i, 0)
    Lifts only the singular values below s_1 / t to s_1 / t and leaves the rest of X untouched.

Both give kappa(X + C) <= t for alpha = 1; alpha scales C (alpha = 0 is the identity).

``mode='graying'`` (Token Graying, arXiv 2505.01996, "Always Skip Attention"):  X + C = U (S / s_1)^eps V^T
    The paper's map, faithfully: every singular value becomes (s_i / s_1)^eps with 0 < eps <= 1 (``epsilon``),
    so kappa -> kappa^eps and the result is rescaled to s_1 = 1 (it does not scale with X). target_kappa plays
    no part; alpha still scales C = U ((S / s_1)^eps - S) V^T. Where the paper is silent we decided: singular
    values at round-off level (s_i <= RANK_RTOL * s_1, the null directions below) map to 0, not to
    (s_i / s_1)^eps. The map has infinite slope at 0, so it would amplify round-off (e.g. 1e-8 -> 4e-3 at
    eps = 0.3) into directions X does not have; a rank-deficient X therefore stays rank-deficient (graying
    lifts nothing from zero and needs no null-space completion), and the zero matrix stays zero. The map does not
    scale with X, so its slope grows as 1 / s_1: below s_1 = 1 / (RANK_RTOL max) of the tokens' dtype (float32:
    2.9e-34; float16: its smallest normal number) it is multiplied by s_1 over that floor, so that the gradient
    (``detach=False``, returned in that dtype) stays finite (:func:`.modes.graying_floor`).
``mode='graying_dct'`` (Token Graying's DCT form, :mod:`.dct_graying`):  X + C = Phi diag(g_k / n_k) Phi^T X
    The same map with the token grid's orthonormal 2-D DCT-II basis Phi in place of U and the norms n_k of the
    frequency rows of Phi^T X in place of S (g_k = (n_k / n_max)^eps): exactly the SVD form where X's left singular
    vectors are DCT vectors, and no eigendecomposition. It needs the grid, so it conditions whole images only.

Rank-deficient X is the common case (a LayerNorm'd patch embedding has X 1 = 0; Swin-T's 4 x 4 x 3 -> 96 patch
embedding has rank <= 49), and then the guarantee needs U and V *completed* over the null directions: a zero
singular value must be lifted along some unit vector orthogonal to range(X). Two implementations, chosen by the
option ``solver``:

The batched path (``solver='eigh'`` or ``'newton_schulz'``; ``'auto'``, the default, picks one,
:mod:`.batched`): one masked program for the whole padded batch, no host sync on the GPU. It conditions
X~ = X + rho E, X plus a fixed canonical term of size rho = 1e-5 ||X||_F that makes it full rank, so every spectral
function of X~^T X~ is unique (no completion, no rank threshold, the same result whatever the eigensolver or device)
and continuous in X at every rank:

    X + C = X + alpha (X~ (I + M) - X),   M = h(X~^T X~)   (sigma_max: X~ (I + M) = X~ + c polar(X~)).

Tolerances (tests/conditioning/test_conditioning_batched.py): kappa(X + C) <= t (1 + 1e-4) at every rank (rank-deficient,
N < d, N close to d, constant, zero, padded); on full-rank inputs ||X + C - reference||_F / ||reference||_F
<= 3e-5 kappa(X) (the canonical term moves the small directions by about rho / s_min); the eigh and
Newton-Schulz solvers give X + C within 1e-4 of ||X + C||_F of each other on every tested input, and within 5e-5 of
||C||_F on rank-deficient regions of fewer tokens than channels inside padded grids (float32 and float64, d = 8
and 96), where both keep kappa <= t (1 + 1e-4).

``solver='reference_gram'`` / ``'reference_svd'`` (:mod:`.reference`, the float64 reference and the tests'
oracle): one image at a time; the Gram path completes the null directions explicitly from fixed band and DCT-II
candidates made canonical (:mod:`.completion`), the SVD path takes LAPACK's completion. ``detach=False`` (the
gradient through the SVD) always runs here.

Centred variant (``centred=True``): a LayerNorm (the next block's norm1) subtracts each token's channel mean,
i.e. projects X onto the complement of the all-ones channel vector 1, so any part of C along 1 never reaches
the attention. The centred variant conditions Y = X Q, the coordinates of X in an orthonormal basis Q of that
complement (d - 1 columns), and adds C = C_Y Q^T: kappa(Y + C_Y) <= t, and C 1 = 0. Q is taken from one
Householder reflection H (H 1/sqrt(d) = e_1, Q = H[:, 1:]), so X Q and C_Y Q^T cost O(N d) each. Where the
ones vector is X's only null direction (a LayerNorm'd patch embedding with at least as many pixel values
per patch as channels), Y has full rank and nothing needs completing.

Token-scale controls (the option ``control``, :mod:`.token_scale`): the correction also makes the tokens bigger,
by r = ||X + C||_F / ||X||_F per image (4-5 for ``sigma_max`` on LayerNorm'd patch embeddings), which by itself
shrinks every block's residual update relative to the stream. Two parameter-free controls separate the two
effects: ``'scale_matched'`` returns r X (the conditioned model's token scale, kappa unchanged; the next
LayerNorm is scale invariant, so the first attention sees what the baseline's sees) and ``'norm_matched'``
returns (X + C) / r (kappa(X + C) <= t at the baseline's token scale; the first attention sees what the
conditioned model's sees). r is a constant in backward.

Per-window conditioning (:func:`condition_token_windows`) applies the same construction to the token matrix
of each attention window of a windowed-attention backbone (Swin, ViTDet) instead of the whole image.

Options: every function takes one :class:`ConditioningOptions` (or keyword options that make one), which checks
them all once; :class:`~condtok_mm.models.TokenConditioner` holds one too. The public functions are in
:mod:`.functional`, the batched path for grids in :mod:`.grids`.
"""
from .centred import channel_mean_complement
from .diagnostics import condition_number, raise_deferred_non_finite
from .functional import condition_token_windows, condition_tokens, condition_valid_regions
from .modes import (ALPHA_MAX, BATCHED_SOLVERS, BOUNDING_MODES, CHECKS, CONDITIONING_MODES, GRAYING_EPSILON,
                    RANK_RTOL, REFERENCE_SOLVERS, SOLVERS, TOKEN_SCALE_CONTROLS)
from .options import ConditioningOptions
from .reference import token_correction, write_conditioned
from .windows import token_windows

__all__ = ['ConditioningOptions', 'condition_tokens', 'condition_token_windows', 'condition_valid_regions',
           'condition_number', 'token_correction', 'write_conditioned', 'token_windows', 'channel_mean_complement',
           'raise_deferred_non_finite', 'BOUNDING_MODES', 'CONDITIONING_MODES', 'GRAYING_EPSILON',
           'TOKEN_SCALE_CONTROLS', 'SOLVERS', 'BATCHED_SOLVERS', 'REFERENCE_SOLVERS', 'CHECKS', 'ALPHA_MAX',
           'RANK_RTOL']
