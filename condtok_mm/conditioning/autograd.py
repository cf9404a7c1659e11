"""Autograd of the correction: C a constant in backward (detach=True), and a thin SVD whose backward stays finite
at rank-deficient and repeated spectra (behind detach=False on the reference path)."""
import torch

from .modes import _lift


class _ConstantCorrection(torch.autograd.Function):
    """X + C, computed outside autograd, with C a constant: the gradient w.r.t. X is the identity.

    Lets the conditioned tokens come out of one float64 product (X (I + M)) instead of X + C.to(dtype).
    """

    @staticmethod
    def forward(ctx, x, conditioned):
        return conditioned

    @staticmethod
    def backward(ctx, grad_out):
        return grad_out, None


class _SafeSVD(torch.autograd.Function):
    """Thin SVD whose backward ignores ill-defined (near-degenerate or near-null) terms."""

    @staticmethod
    def forward(ctx, x):
        u, s, vh = torch.linalg.svd(x, full_matrices=False)
        ctx.save_for_backward(u, s, vh)
        return u, s, vh

    @staticmethod
    def backward(ctx, gu, gs, gvh):
        u, s, vh = ctx.saved_tensors
        v = vh.transpose(-1, -2)
        gv = gvh.transpose(-1, -2)
        # Terms whose singular values differ (or vanish) by less than 1e-8 s_1 are ill-defined.
        eps = 1e-8 * s[..., :1].clamp_min(1e-300)
        s_i, s_j = s.unsqueeze(-1), s.unsqueeze(-2)
        denom = s_j ** 2 - s_i ** 2
        off = denom.abs() > eps.unsqueeze(-1) * (s_i + s_j)
        f = torch.where(off, 1 / torch.where(off, denom, torch.ones_like(denom)), torch.zeros_like(denom))
        ut_gu = u.transpose(-1, -2) @ gu
        vt_gv = v.transpose(-1, -2) @ gv
        j_u = f * (ut_gu - ut_gu.transpose(-1, -2))
        j_v = f * (vt_gv - vt_gv.transpose(-1, -2))
        s_diag = torch.diag_embed(s)
        inner = u @ (torch.diag_embed(gs) + j_u @ s_diag + s_diag @ j_v) @ vh
        live = s > eps
        inv_s = torch.where(live, 1 / torch.where(live, s, torch.ones_like(s)), torch.zeros_like(s))
        # (I - U U^T) gU S^-1 V^T + U S^-1 gV^T (I - V V^T), without forming the N x N projector
        gu_perp = gu - u @ ut_gu
        gvt_perp = gv.transpose(-1, -2) - vt_gv.transpose(-1, -2) @ vh
        outer_u = (gu_perp * inv_s.unsqueeze(-2)) @ vh
        outer_v = u @ (inv_s.unsqueeze(-1) * gvt_perp)
        return inner + outer_u + outer_v


def _correction_safe_svd(x: torch.Tensor, options, s1_floor: float = 0.0) -> torch.Tensor:
    """C = U D(s) V^T through :class:`_SafeSVD`, D the lift of ``options`` (alpha a float)."""
    u, s, vh = _SafeSVD.apply(x)
    return (u * _lift(s, s[..., :1], options, s1_floor).unsqueeze(-2)) @ vh

