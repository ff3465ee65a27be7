"""Fused launches of the rollout decode step (issue #19): the same bits as the separate ops, fewer
launches per layer.

A captured Qwen3-8B decode step at batch 1 is ~20 launches per layer, most of them a few
microseconds of work; each launch costs its own ramp-up and drain. The two fusions here change no
arithmetic:

* :func:`add_rms_norm`: the residual add ``s = x + delta`` (FP32 add of two BF16 values, rounded
  once: ``torch.add``'s bits) and ``rms_norm(s)`` in one launch of the norm kernel, which
  normalises the very BF16 values it stores (:func:`rl_engine.ops.rms_norm.triton.add_rms_norm_fwd`);
* :func:`kv_cache_write`: the K and V rows of a step stored into the static cache in one launch
  (two ``index_put`` launches before): a copy, no arithmetic.

The model takes them only from an op table that has them (:meth:`Qwen3Model.decode_ops`, the
engine's table); every other table runs the separate ops in the same order at the same sites.
Only ``triton_cuda_bf16`` provides them today (the CUDA backend runs the separate ops).
"""

from __future__ import annotations

from typing import Any, Callable

import torch
import triton
import triton.language as tl

from rl_engine.errors import InputError
from rl_engine.ops._triton_common import FP_FUSION

FUSED_BACKENDS = ("triton_cuda_bf16",)
"""Backends whose kernels the fusions here are built from."""


def _check_rows(name: str, t: torch.Tensor, shape: tuple[int, ...], device: torch.device) -> None:
    if t.dtype != torch.bfloat16 or tuple(t.shape) != shape or t.device != device or (t.numel() and t.stride(-1) != 1):
        raise InputError(f"{name}: expected bfloat16 {list(shape)} on {device} with unit stride on the last axis, "
                         f"got {t.dtype} {list(t.shape)} on {t.device} with strides {list(t.stride())}")


def add_rms_norm(x: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor, eps: float,
                 order: str) -> tuple[torch.Tensor, torch.Tensor]:
    """``(s, rms_norm(s))`` with ``s = x + delta``: the residual add and the next RMSNorm in one launch.

    Parameters
    ----------
    x, delta : [T, E] bfloat16, unit stride on the last axis (the residual stream and the block's
        output). weight : [E] bfloat16. eps : float. order : ``"hf"`` or ``"fused"`` (the
        contract's ``rms_norm_order``, as for ``rms_norm``).

    Returns
    -------
    (s, y) : [T, E] bfloat16 each; ``s`` is bitwise ``x + delta`` and ``y`` bitwise
    ``rms_norm(s, weight, eps, order)`` of ``triton_cuda_bf16`` (FP32 inside: the add, the fixed
    row sum, IEEE division and square root; ``docs/declared-arithmetic.md``).

    Raises
    ------
    InputError
        Shapes, dtypes, devices or strides other than the above, or an unknown ``order``.
    """
    from rl_engine.ops.rms_norm.op import check_rows
    from rl_engine.ops.rms_norm.triton import add_rms_norm_fwd

    check_rows(x, weight, eps, order, 2)
    _check_rows("add_rms_norm delta", delta, tuple(x.shape), x.device)
    return add_rms_norm_fwd(x, delta, weight, float(eps), order == "hf")


@triton.jit
def _kv_write_kernel(k_ptr, v_ptr, kc_ptr, vc_ptr, rows_ptr, pos_ptr,
                     s_kt, s_kh, s_vt, s_vh, s_cb, s_cs, s_ch, s_vcb, s_vcs, s_vch,
                     D: tl.constexpr, HD: tl.constexpr):
    """Token ``t``'s K and V rows [Hkv, D] into cache slot ``(rows[t], positions[t])``."""
    t = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, HD)
    h = (offs // D).to(tl.int64)
    d = (offs % D).to(tl.int64)
    row = tl.load(rows_ptr + t).to(tl.int64)
    pos = tl.load(pos_ptr + t).to(tl.int64)
    k = tl.load(k_ptr + t * s_kt + h * s_kh + d)
    v = tl.load(v_ptr + t * s_vt + h * s_vh + d)
    tl.store(kc_ptr + row * s_cb + pos * s_cs + h * s_ch + d, k)
    tl.store(vc_ptr + row * s_vcb + pos * s_vcs + h * s_vch + d, v)


def kv_cache_write(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                   rows: torch.Tensor, positions: torch.Tensor) -> None:
    """``k_cache[rows[t], positions[t]] = k[t]`` and the same for ``v``, in one launch.

    Parameters
    ----------
    k, v : [T, Hkv, D] bfloat16, unit stride on D (views of a packed projection are fine).
    k_cache, v_cache : [B, S_max, Hkv, D] bfloat16, unit stride on D. rows, positions : [T] int64 on
        the same device: the cache row and slot of each token, which the caller validated (the
        engine's plan, :meth:`Qwen3Model.check_positions`); the kernel reads them on the device
        and does not check them again, so the call can be captured in a CUDA graph.

    Raises
    ------
    InputError
        Shapes, dtypes, devices or strides other than the above, or Hkv * D not a power of two.
    """
    if k.dim() != 3:
        raise InputError(f"kv_cache_write: k must be [T, Hkv, D], got {list(k.shape)}")
    t, hkv, d = k.shape
    dev = k.device
    _check_rows("kv_cache_write k", k, (t, hkv, d), dev)
    _check_rows("kv_cache_write v", v, (t, hkv, d), dev)
    if k_cache.dim() != 4:
        raise InputError(f"kv_cache_write: k_cache must be [B, S_max, Hkv, D], got {list(k_cache.shape)}")
    cache_shape = (k_cache.shape[0], k_cache.shape[1], hkv, d)
    _check_rows("kv_cache_write k_cache", k_cache, cache_shape, dev)
    _check_rows("kv_cache_write v_cache", v_cache, cache_shape, dev)
    for name, ix in (("rows", rows), ("positions", positions)):
        if ix.dtype != torch.int64 or tuple(ix.shape) != (t,) or ix.device != dev:
            raise InputError(f"kv_cache_write {name}: expected int64 [{t}] on {dev}, got {ix.dtype} "
                             f"{list(ix.shape)} on {ix.device}")
    hd = hkv * d
    if hd & (hd - 1):
        raise InputError(f"kv_cache_write: Hkv * D = {hd} must be a power of two")
    if t == 0:
        return
    _kv_write_kernel[(t,)](
        k, v, k_cache, v_cache, rows, positions, k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), v_cache.stride(0), v_cache.stride(1),
        v_cache.stride(2), D=d, HD=hd, num_warps=4, enable_fp_fusion=FP_FUSION)


def fused_decode_impls(backend: str) -> dict[str, Callable[..., Any]]:
    """The fused implementations ``backend`` has, by op-table name (``add_rms_norm``,
    ``kv_cache_write``); empty for a backend without them."""
    if backend not in FUSED_BACKENDS:
        return {}
    return {"add_rms_norm": add_rms_norm, "kv_cache_write": kv_cache_write}


__all__ = ["FUSED_BACKENDS", "add_rms_norm", "fused_decode_impls", "kv_cache_write"]
