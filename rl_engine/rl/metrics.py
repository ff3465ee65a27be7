"""Training / rollout mismatch metrics under verl's names (rollout correction diagnostics).

Shape glossary: B sequences, C completion positions (padded), N active tokens.

Inputs are the two logprobs of every sampled token: ``old_log_prob`` [B, C], what the trainer
computes by teacher forcing before the update (verl's ``old_log_prob``), and ``rollout_log_prob``
[B, C], what the sampler returned with the token; ``response_mask`` [B, C] marks the active
(scored) tokens. The metrics are written here from their definitions (verl's rollout-correction
docs, ``docs/algo/rollout_corr.md`` and ``rollout_corr_math.md``, and its trainer debug metrics),
not copied from verl. With ``r = old - rollout`` per token (the log importance ratio
``log pi_train / pi_rollout``), ``mean_b(x)`` the masked mean of ``x`` over sequence ``b``'s
active tokens, and ``E_tok`` the masked mean over all active tokens of the batch:

=========================================  =================================================
``rollout_corr/training_ppl``              ``mean_b exp(-mean_b(old))``
``rollout_corr/training_log_ppl``          ``mean_b (-mean_b(old))``
``rollout_corr/rollout_ppl``               ``mean_b exp(-mean_b(rollout))``
``rollout_corr/rollout_log_ppl``           ``mean_b (-mean_b(rollout))``
``rollout_corr/kl``                        ``E_tok (rollout - old)`` (K1 estimate of KL(rollout || train))
``rollout_corr/k3_kl``                     ``E_tok (exp(r) - r - 1)`` (K3 estimate, no clamp)
``rollout_corr/log_ppl_diff``              ``mean over b of d_b``, ``d_b = mean_b(rollout) - mean_b(old)``
``rollout_corr/log_ppl_abs_diff``          ``mean over b of |d_b|``
``rollout_corr/log_ppl_diff_max`` / min    ``max`` / ``min`` over b of ``d_b``
``rollout_corr/ppl_ratio``                 ``mean over b of exp(d_b)``
``rollout_corr/chi2_token``                ``E_tok exp(clamp(r, -20, 20))^2 - 1``
``rollout_corr/chi2_seq``                  ``mean over b of exp(2 clamp(sum_b r, -20, 20)) - 1``
``training/rollout_probs_diff_max``        ``max |exp(rollout) - exp(old)|`` over active tokens
``training/rollout_probs_diff_mean``       its mean
``training/rollout_probs_diff_std``        its standard deviation (unbiased, N - 1; NaN for N = 1)
``training/rollout_actor_probs_pearson_corr``  Pearson correlation of ``exp(rollout)`` and ``exp(old)``
                                           over active tokens (NaN when either side is constant)
=========================================  =================================================

The chi-square clamps at ``+-``:data:`CHI2_LOG_RATIO_BOUND` follow verl, which bounds the log
ratio (its ``SAFETY_BOUND``) before ``exp`` so one extreme token cannot overflow the mean; the other
metrics are not clamped. The project's own metrics:

* ``max_abs_dlogp``: ``max |old - rollout|`` over active tokens;
* ``ratio_min``, ``ratio_max``: min and max of the importance ratio ``exp(old - rollout)`` over
  active tokens (exactly 1.0 both when every token's two logprobs are equal);
* ``active_tokens``: N; ``sequences``: sequences with at least one active token;
* ``bitwise_equal_tokens``: active tokens whose two logprobs have the same bits (compared as
  float64, an exact upcast of the FP32 inputs).

Everything is computed in float64 from the given values (FP32 upcast exactly); a sequence with no
active token is left out of the sequence means. These are reporting statistics: no threshold is
applied here (judgments live in the contract). A non-finite logprob at an active token propagates
into the metrics it enters (NaN), which is what a report should show.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from rl_engine.errors import InputError

CHI2_LOG_RATIO_BOUND = 20.0
"""The bound on the log importance ratio (token ``r``, or a sequence's ``sum r``) before ``exp`` in
the chi-square metrics, as verl does (``exp(40)`` stays far inside float64)."""

ROLLOUT_CORR_NAMES = (
    "rollout_corr/training_ppl", "rollout_corr/training_log_ppl", "rollout_corr/kl", "rollout_corr/k3_kl",
    "rollout_corr/rollout_ppl", "rollout_corr/rollout_log_ppl", "rollout_corr/log_ppl_diff",
    "rollout_corr/log_ppl_abs_diff", "rollout_corr/log_ppl_diff_max", "rollout_corr/log_ppl_diff_min",
    "rollout_corr/ppl_ratio", "rollout_corr/chi2_token", "rollout_corr/chi2_seq",
)
"""verl's ``rollout_corr/`` off-policy diagnostics, in verl's order."""

DEBUG_NAMES = (
    "training/rollout_probs_diff_max", "training/rollout_probs_diff_mean", "training/rollout_probs_diff_std",
    "training/rollout_actor_probs_pearson_corr",
)
"""verl's trainer debug metrics on the token probabilities."""

VERL_NAMES = ROLLOUT_CORR_NAMES + DEBUG_NAMES
PROJECT_NAMES = ("max_abs_dlogp", "ratio_min", "ratio_max", "active_tokens", "sequences", "bitwise_equal_tokens")
METRIC_NAMES = VERL_NAMES + PROJECT_NAMES


def _check(old: torch.Tensor, rollout: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    for name, t in (("old_log_prob", old), ("rollout_log_prob", rollout)):
        if not isinstance(t, torch.Tensor) or not t.is_floating_point():
            raise InputError(f"{name}: expected a floating-point tensor, got "
                             f"{t.dtype if isinstance(t, torch.Tensor) else type(t).__name__}")
        if t.dim() != 2:
            raise InputError(f"{name}: expected [B, C], got shape {list(t.shape)}")
    if not isinstance(mask, torch.Tensor) or mask.dim() != 2:
        raise InputError(f"response_mask: expected a [B, C] tensor, got "
                         f"{list(mask.shape) if isinstance(mask, torch.Tensor) else type(mask).__name__}")
    if old.shape != rollout.shape or mask.shape != old.shape:
        raise InputError(f"shapes differ: old_log_prob {list(old.shape)}, rollout_log_prob {list(rollout.shape)}, "
                         f"response_mask {list(mask.shape)}")
    if old.device != rollout.device or mask.device != old.device:
        raise InputError(f"devices differ: {old.device}, {rollout.device}, {mask.device}")
    if mask.dtype != torch.bool:
        if mask.is_complex() or not bool(((mask == 0) | (mask == 1)).all()):
            raise InputError("response_mask: expected bool or 0/1 values")
        mask = mask != 0
    if not bool(mask.any()):
        raise InputError("response_mask: no active token (nothing to measure)")
    return mask


def mismatch_metrics(old_log_prob: torch.Tensor, rollout_log_prob: torch.Tensor,
                     response_mask: torch.Tensor) -> dict[str, float | int]:
    """The metrics of the module docstring, ``name -> value`` in :data:`METRIC_NAMES` order.

    ``old_log_prob``, ``rollout_log_prob`` [B, C] floating point (FP32 from the project; any float
    dtype upcasts exactly to the float64 the metrics are computed in); ``response_mask`` [B, C]
    bool or 0/1. Values at inactive positions are ignored (padding may hold anything). Returns
    Python floats (ints for the counts).

    Raises
    ------
    InputError
        Wrong rank, shapes or devices that differ, a non-float logprob tensor, a mask with other
        values than 0/1, or no active token at all.
    """
    mask = _check(old_log_prob, rollout_log_prob, response_mask)
    f64 = torch.float64
    zero = torch.zeros((), dtype=f64, device=mask.device)
    old = torch.where(mask, old_log_prob.to(f64), zero)
    roll = torch.where(mask, rollout_log_prob.to(f64), zero)
    w = mask.to(f64)
    n = w.sum()
    per_seq = w.sum(dim=1)
    has = per_seq > 0  # sequences with an active token
    seqs = int(has.sum())

    def tok_mean(x: torch.Tensor) -> torch.Tensor:
        return torch.where(mask, x, zero).sum() / n

    mean_old = old.sum(dim=1)[has] / per_seq[has]  # [B'] masked mean per sequence
    mean_roll = roll.sum(dim=1)[has] / per_seq[has]
    r = old - roll  # log(pi_train / pi_rollout), 0 at inactive positions
    bound = CHI2_LOG_RATIO_BOUND
    d = mean_roll - mean_old  # [B'] log-ppl difference per sequence (rollout - training mean logprob)
    m: dict[str, torch.Tensor | float | int] = {
        "rollout_corr/training_ppl": torch.exp(-mean_old).mean(),
        "rollout_corr/training_log_ppl": (-mean_old).mean(),
        "rollout_corr/kl": tok_mean(roll - old),
        "rollout_corr/k3_kl": tok_mean(torch.exp(r) - r - 1.0),
        "rollout_corr/rollout_ppl": torch.exp(-mean_roll).mean(),
        "rollout_corr/rollout_log_ppl": (-mean_roll).mean(),
        "rollout_corr/log_ppl_diff": d.mean(),
        "rollout_corr/log_ppl_abs_diff": d.abs().mean(),
        "rollout_corr/log_ppl_diff_max": d.max(),
        "rollout_corr/log_ppl_diff_min": d.min(),
        "rollout_corr/ppl_ratio": torch.exp(d).mean(),
        "rollout_corr/chi2_token": tok_mean(torch.exp(r.clamp(-bound, bound)).square()) - 1.0,
        "rollout_corr/chi2_seq": (torch.exp(2.0 * r.sum(dim=1)[has].clamp(-bound, bound)) - 1.0).mean(),
    }
    p_old = torch.exp(old[mask])  # [N]
    p_roll = torch.exp(roll[mask])
    diff = (p_roll - p_old).abs()
    m["training/rollout_probs_diff_max"] = diff.max()
    m["training/rollout_probs_diff_mean"] = diff.mean()
    m["training/rollout_probs_diff_std"] = diff.std() if diff.numel() > 1 else float("nan")
    m["training/rollout_actor_probs_pearson_corr"] = pearson(p_roll, p_old)
    ratio = torch.exp(r[mask])
    a, b = old_log_prob[mask].to(f64), rollout_log_prob[mask].to(f64)
    m["max_abs_dlogp"] = (a - b).abs().max()
    m["ratio_min"] = ratio.min()
    m["ratio_max"] = ratio.max()
    m["active_tokens"] = int(n)
    m["sequences"] = seqs
    m["bitwise_equal_tokens"] = int((a.view(torch.int64) == b.view(torch.int64)).sum())
    return {k: (float(v) if isinstance(v, torch.Tensor) else v) for k, v in m.items()}


def pearson(x: torch.Tensor, y: torch.Tensor) -> float:
    """Pearson correlation of two [N] float64 vectors: ``sum(dx dy) / sqrt(sum(dx^2) sum(dy^2))`` with
    ``dx = x - mean(x)``; NaN for N < 2 or when either side is constant (no correlation defined)."""
    if x.numel() < 2:
        return float("nan")
    dx, dy = x - x.mean(), y - y.mean()
    den = torch.sqrt((dx * dx).sum() * (dy * dy).sum())
    if float(den) == 0.0:
        return float("nan")
    return float((dx * dy).sum() / den)


def pad_rows(rows: Sequence[torch.Tensor], fill: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Stack 1-D [C_b] tensors into ``([B, C_max] values, [B, C_max] bool mask)``; padding is ``fill``
    and masked out. Dtype and device of the first row (FP32 logprobs stay FP32).

    Raises InputError for no rows or a row that is not 1-D."""
    if not rows:
        raise InputError("no sequences")
    for i, t in enumerate(rows):
        if t.dim() != 1:
            raise InputError(f"rows[{i}]: expected a 1-D tensor, got shape {list(t.shape)}")
    c = max(int(t.numel()) for t in rows)
    first = rows[0]
    out = torch.full((len(rows), c), fill, dtype=first.dtype, device=first.device)
    mask = torch.zeros((len(rows), c), dtype=torch.bool, device=first.device)
    for i, t in enumerate(rows):
        out[i, : t.numel()] = t.to(first.dtype)
        mask[i, : t.numel()] = True
    return out, mask


def ratio_exactly_one(metrics: dict[str, float | int]) -> bool:
    """Whether every active token's importance ratio was exactly 1.0 (``ratio_min == ratio_max == 1``)."""
    return metrics["ratio_min"] == 1.0 and metrics["ratio_max"] == 1.0
