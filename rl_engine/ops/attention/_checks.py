"""Input checks shared by every attention backend (run before any math or kernel launch).

Shape glossary: B batch, S_max cache slots, T packed tokens (Tq queries, Tk keys), H query heads,
Hkv KV heads, D head dim. Every check raises :class:`rl_engine.errors.InputError` naming the
argument, what was expected and what was given. Nothing is cast, clamped or dropped.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

import torch

from rl_engine.errors import InputError
from rl_engine.ops._validate import check_cu_seqlens, check_same_device, check_tensor


class LaunchPlan(NamedTuple):
    """What the launchers read of a validated varlen call: host ints, no tensors."""

    batch: int
    max_lq: int
    max_lk: int


@dataclass(frozen=True)
class VarlenPlan:
    """Host-side facts about a validated varlen call (the launcher needs them). Built once by
    :func:`check_varlen`; a caller that keeps it can hand it back to skip reading cu_seqlens again
    (the capture-safe form of a varlen call)."""

    cu_q: tuple[int, ...]
    cu_k: tuple[int, ...]

    @property
    def batch(self) -> int:
        return len(self.cu_q) - 1

    @property
    def max_lq(self) -> int:
        return max([0] + [self.cu_q[b + 1] - self.cu_q[b] for b in range(self.batch)])  # no default=: dynamo

    @property
    def max_lk(self) -> int:
        return max([0] + [self.cu_k[b + 1] - self.cu_k[b] for b in range(self.batch)])

    def launch_plan(self) -> LaunchPlan:
        return LaunchPlan(self.batch, self.max_lq, self.max_lk)


def _check_scale(scale: object) -> None:
    if isinstance(scale, bool) or not isinstance(scale, (int, float)):
        raise InputError(f"scale: expected a Python float, got {type(scale).__name__}")
    if not math.isfinite(float(scale)):
        raise InputError(f"scale: expected a finite number, got {scale}")


def _check_heads(h: int, hkv: int, d: int, dk: int, *, kernel: bool) -> None:
    if dk != d:
        raise InputError(f"head dim D differs between q ({d}) and k/v ({dk})")
    if hkv < 1 or h < 1:
        raise InputError(f"expected at least one query head and one KV head, got H={h}, Hkv={hkv}")
    if h % hkv:
        raise InputError(f"GQA needs H % Hkv == 0, got H={h}, Hkv={hkv}")
    if kernel and (d < 16 or d & (d - 1)):
        raise InputError(f"head dim D must be a power of two >= 16 for the kernel, got D={d}")


def check_varlen(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    scale: object,
    *,
    dtype: torch.dtype,
    kernel: bool,
) -> VarlenPlan:
    """Validate a varlen attention call.

    q [Tq, H, D], k and v [Tk, Hkv, D] of ``dtype`` with unit stride on D (token and head
    strides are free, so views of a fused qkv buffer pass); cu_seqlens_q / cu_seqlens_k int32
    [B+1], contiguous, on the same device, starting at 0, non-decreasing, ending at Tq / Tk, and
    ``Lq <= Lk`` for every sequence. ``kernel=True`` also asks for D a power of two >= 16.
    """
    tq, tk = _check_varlen_tensors(q, k, v, cu_seqlens_q, cu_seqlens_k, scale, dtype=dtype, kernel=kernel)
    cq = check_cu_seqlens("cu_seqlens_q", cu_seqlens_q, tq)
    ck = check_cu_seqlens("cu_seqlens_k", cu_seqlens_k, tk)
    if len(cq) != len(ck):
        raise InputError(
            f"cu_seqlens_q has {len(cq) - 1} sequences but cu_seqlens_k has {len(ck) - 1}; they must match"
        )
    for b in range(len(cq) - 1):
        lq, lk = cq[b + 1] - cq[b], ck[b + 1] - ck[b]
        if lq > lk:
            raise InputError(
                f"sequence {b}: {lq} queries but only {lk} keys; queries sit at the end of their keys, so Lq <= Lk"
            )
    return VarlenPlan(tuple(cq), tuple(ck))


def _check_varlen_tensors(q, k, v, cu_seqlens_q, cu_seqlens_k, scale, *, dtype, kernel) -> tuple[int, int]:
    """The checks of :func:`check_varlen` that read no device value; returns ``(Tq, Tk)``."""
    check_tensor("q", q, dtype=dtype, ndim=3, contiguous_last=True)
    check_tensor("k", k, dtype=dtype, ndim=3, contiguous_last=True)
    check_tensor("v", v, dtype=dtype, ndim=3, contiguous_last=True)
    if tuple(v.shape) != tuple(k.shape):
        raise InputError(f"v: expected the shape of k {list(k.shape)}, got {list(v.shape)}")
    tq, h, d = q.shape
    tk, hkv, dk = k.shape
    _check_heads(h, hkv, d, dk, kernel=kernel)
    check_tensor("cu_seqlens_q", cu_seqlens_q, dtype=torch.int32, ndim=1, contiguous=True)
    check_tensor("cu_seqlens_k", cu_seqlens_k, dtype=torch.int32, ndim=1, contiguous=True)
    check_same_device(q=q, k=k, v=v, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k)
    _check_scale(scale)
    return tq, tk


def check_varlen_planned(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    scale: object,
    plan: object,
    *,
    dtype: torch.dtype,
    kernel: bool,
) -> VarlenPlan:
    """:func:`check_varlen` for a caller that hands back the :class:`VarlenPlan` of an earlier
    call: every check that reads no device value (dtypes, shapes, strides, heads, devices, scale),
    and the plan against these tensors (its batch against the cu_seqlens lengths, its last entries
    against Tq and Tk). The cu_seqlens values themselves are not read again (no host
    synchronisation): that they are the ones the plan was built from is the caller's promise.

    Raises
    ------
    InputError
        As :func:`check_varlen`, or ``plan`` is not a VarlenPlan or does not fit these tensors.
    """
    if not isinstance(plan, VarlenPlan):
        raise InputError(f"plan: expected the VarlenPlan returned by check_varlen, got {type(plan).__name__}")
    tq, tk = _check_varlen_tensors(q, k, v, cu_seqlens_q, cu_seqlens_k, scale, dtype=dtype, kernel=kernel)
    for name, cu, planned, total in (("cu_seqlens_q", cu_seqlens_q, plan.cu_q, tq),
                                     ("cu_seqlens_k", cu_seqlens_k, plan.cu_k, tk)):
        if cu.numel() != len(planned):
            raise InputError(f"plan: built for {len(planned) - 1} sequences, but {name} holds {cu.numel() - 1}")
        if planned[-1] != total:
            raise InputError(f"plan: its {name} ends at {planned[-1]}, but the call has {total} tokens there")
    return plan


def check_decode(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    cache_seqlens: torch.Tensor,
    scale: object,
    *,
    dtype: torch.dtype,
    kernel: bool,
    validate: bool = True,
) -> list[int] | None:
    """Validate a decode call; return ``cache_seqlens`` as a host list (None without ``validate``).

    q [B, H, D], k_cache and v_cache [B, S_max, Hkv, D] of ``dtype`` with unit stride on D (other
    strides free); cache_seqlens int32 [B], contiguous, same device, every value in [0, S_max]
    (the range only with ``validate``: it reads device values, a host synchronisation; skip it
    inside a CUDA graph capture, where the caller guarantees the range).
    """
    check_tensor("q", q, dtype=dtype, ndim=3, contiguous_last=True)
    check_tensor("k_cache", k_cache, dtype=dtype, ndim=4, contiguous_last=True)
    check_tensor("v_cache", v_cache, dtype=dtype, ndim=4, contiguous_last=True)
    if tuple(v_cache.shape) != tuple(k_cache.shape):
        raise InputError(f"v_cache: expected the shape of k_cache {list(k_cache.shape)}, got {list(v_cache.shape)}")
    b, h, d = q.shape
    bc, s_max, hkv, dk = k_cache.shape
    if bc != b:
        raise InputError(f"k_cache: expected batch {b} (from q), got shape {list(k_cache.shape)}")
    _check_heads(h, hkv, d, dk, kernel=kernel)
    check_tensor("cache_seqlens", cache_seqlens, dtype=torch.int32, shape=(b,), contiguous=True)
    check_same_device(q=q, k_cache=k_cache, v_cache=v_cache, cache_seqlens=cache_seqlens)
    _check_scale(scale)
    if not validate:
        return None
    lens = [int(x) for x in cache_seqlens.tolist()]
    for i, n in enumerate(lens):
        if n < 0 or n > s_max:
            raise InputError(f"cache_seqlens: entry {i} is {n}, outside [0, S_max={s_max}]")
    return lens
