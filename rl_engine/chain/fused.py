"""Fused launches of the rollout decode step (issue #19): the same bits as the separate ops, fewer
launches per layer.

A captured Qwen3-8B decode step at batch 1 is ~20 launches per layer, most of them a few
microseconds of work; each launch costs its own ramp-up and drain. The two fusions here change no
arithmetic:

* :func:`add_rms_norm`: the residual add ``s = x + delta`` (FP32 add of two BF16 values, rounded
  once: ``torch.add``'s bits) and ``rms_norm(s)`` in one launch of the norm kernel, which
  normalises the very BF16 values it stores (:func:`rl_engine.ops.rms_norm.triton.add_rms_norm_fwd`);
* :func:`qk_norm_rope`: ``qk_norm`` of q and k, their rotation and the K/V cache write in one
  launch (five before: two norms, two rotations, the indexed cache store): the norm's and the
  rotation's own steps and roundings, in registers; the cache write is a copy.

The model takes them only from an op table that has them (:meth:`Qwen3Model.decode_ops`, the
engine's table; :meth:`Qwen3Model.training_ops` has differentiable forms of both, without the
cache write); every other table runs the separate ops in the same order at the same sites.
Both backends provide them: :func:`add_rms_norm` / :func:`qk_norm_rope` are the Triton kernels,
:func:`add_rms_norm_cuda` / :func:`qk_norm_rope_cuda` the CUDA C++ ones
(``rl_engine/backends/cuda_src/norm.cu``), each with its own backend's separate ops' bits.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable

import torch
import triton
import triton.language as tl

from rl_engine.errors import InputError
from rl_engine.ops._triton_common import FP_FUSION, cdiv
from rl_engine.ops.rms_norm import cuda as _cuda_norm
from rl_engine.ops.rms_norm.triton import _norm_rope_row

FUSED_BACKENDS = ("triton_cuda_bf16", "cuda_bf16")
"""Backends whose kernels the fusions here are built from."""


def _check_rows(name: str, t: torch.Tensor, shape: tuple[int, ...], device: torch.device) -> None:
    if t.dtype != torch.bfloat16 or tuple(t.shape) != shape or t.device != device or (t.numel() and t.stride(-1) != 1):
        raise InputError(f"{name}: expected bfloat16 {list(shape)} on {device} with unit stride on the last axis, "
                         f"got {t.dtype} {list(t.shape)} on {t.device} with strides {list(t.stride())}")


def _check_cache(op: str, k_cache: torch.Tensor, v_cache: torch.Tensor, rows: torch.Tensor, positions: torch.Tensor,
                 t: int, hkv: int, d: int, dev: torch.device) -> None:
    """Caches [B, S_max, Hkv, D] bfloat16 with unit stride on D; rows, positions [T] int64."""
    if k_cache.dim() != 4:
        raise InputError(f"{op}: k_cache must be [B, S_max, Hkv, D], got {list(k_cache.shape)}")
    cache_shape = (k_cache.shape[0], k_cache.shape[1], hkv, d)
    _check_rows(f"{op} k_cache", k_cache, cache_shape, dev)
    _check_rows(f"{op} v_cache", v_cache, cache_shape, dev)
    for name, ix in (("rows", rows), ("positions", positions)):
        if ix.dtype != torch.int64 or tuple(ix.shape) != (t,) or ix.device != dev:
            raise InputError(f"{op} {name}: expected int64 [{t}] on {dev}, got {ix.dtype} {list(ix.shape)} on {ix.device}")


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
    from rl_engine.ops.rms_norm.triton import add_rms_norm_fwd

    _check_add_rms_norm(x, delta, weight, eps, order)
    return add_rms_norm_fwd(x, delta, weight, float(eps), order == "hf")


def _check_add_rms_norm(x: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor, eps: float, order: str) -> None:
    from rl_engine.ops.rms_norm.op import check_rows

    check_rows(x, weight, eps, order, 2)
    _check_rows("add_rms_norm delta", delta, tuple(x.shape), x.device)


CUDA_ADD_RMS_MAX_E = _cuda_norm.ADD_RMS_MAX_E
"""Longest row of :func:`add_rms_norm_cuda` (the row's x, delta and weight are staged in 48 KiB of
shared memory)."""


def add_rms_norm_cuda(x: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor, eps: float,
                      order: str) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`add_rms_norm` on the ``cuda_bf16`` backend: ``(s, y)`` bitwise ``(x + delta,
    rms_norm(s))`` of that backend's separate launches (``rl_add_rms_norm_fwd``: the add rounded
    once, then ``rl_rms_norm_fwd``'s column order, butterfly, division and square root, FP32 inside).

    Same shapes, dtypes and errors as :func:`add_rms_norm`, and E <= :data:`CUDA_ADD_RMS_MAX_E`
    (InputError above it, before any launch); BackendUnavailable without an sm_90 GPU.
    """
    from rl_engine.backends.cuda_launch import check_cuda_device, launch

    _check_add_rms_norm(x, delta, weight, eps, order)
    t, e = x.shape
    if e > CUDA_ADD_RMS_MAX_E:
        raise InputError(f"add_rms_norm_cuda: E = {e} is above the kernel's {CUDA_ADD_RMS_MAX_E}")
    check_cuda_device(x, delta, weight)
    s = torch.empty((t, e), dtype=torch.bfloat16, device=x.device)
    y = torch.empty((t, e), dtype=torch.bfloat16, device=x.device)
    if t and e:
        launch(x.device, "rl_add_rms_norm_fwd", x, delta, weight, s, y, None, t, e, x.stride(0), delta.stride(0),
               s.stride(0), y.stride(0), float(eps), 1 if order == "hf" else 0)
    return s, y


@triton.jit
def _qk_norm_rope_kernel(q_ptr, k_ptr, v_ptr, qw_ptr, kw_ptr, cos_ptr, sin_ptr, qo_ptr, ko_ptr, kc_ptr, vc_ptr,
                         rows_ptr, pos_ptr, n_q, n_kv, eps, n_float,
                         s_qt, s_qh, s_kt, s_kh, s_vt, s_vh, s_ct, s_st, s_qot, s_qoh, s_kot, s_koh,
                         s_cb, s_cs, s_ch, s_vcb, s_vcs, s_vch,
                         D: tl.constexpr, HALF: tl.constexpr, HF_ORDER: tl.constexpr, LANES: tl.constexpr,
                         CHUNKS: tl.constexpr, CACHE: tl.constexpr):
    """Program ``(t, r)``: rows ``r < n_q`` are query heads, then ``n_kv`` key heads (normed,
    rotated, stored, and with ``CACHE`` written to the cache), then ``n_kv`` value heads (only
    copied to the cache). The norm is :func:`rl_engine.ops.rms_norm.triton._rms_fwd_kernel`'s steps
    on one row of D (the same lane sums, fixed tree, IEEE division and square root, roundings);
    the rotation is :func:`rl_engine.ops.rope.triton._rope_kernel`'s on the norm's BF16 output."""
    t = tl.program_id(0).to(tl.int64)
    r = tl.program_id(1)
    cols = tl.arange(0, HALF)
    if CACHE:
        row = tl.load(rows_ptr + t).to(tl.int64)
        pos = tl.load(pos_ptr + t).to(tl.int64)
    if r >= n_q + n_kv:  # a value head: the cache stores v_proj's bits
        h = (r - n_q - n_kv).to(tl.int64)
        if CACHE:
            src = v_ptr + t * s_vt + h * s_vh
            dst = vc_ptr + row * s_vcb + pos * s_vcs + h * s_vch
            tl.store(dst + cols, tl.load(src + cols))
            tl.store(dst + HALF + cols, tl.load(src + HALF + cols))
    elif r < n_q:
        h = r.to(tl.int64)
        o1, o2, _ = _norm_rope_row(q_ptr + t * s_qt + h * s_qh, qw_ptr, cos_ptr + t * s_ct, sin_ptr + t * s_st, eps,
                                n_float, D, HALF, HF_ORDER, LANES, CHUNKS)
        out = qo_ptr + t * s_qot + h * s_qoh
        tl.store(out + cols, o1)
        tl.store(out + HALF + cols, o2)
    else:
        h = (r - n_q).to(tl.int64)
        o1, o2, _ = _norm_rope_row(k_ptr + t * s_kt + h * s_kh, kw_ptr, cos_ptr + t * s_ct, sin_ptr + t * s_st, eps,
                                n_float, D, HALF, HF_ORDER, LANES, CHUNKS)
        out = ko_ptr + t * s_kot + h * s_koh
        tl.store(out + cols, o1)
        tl.store(out + HALF + cols, o2)
        if CACHE:
            dst = kc_ptr + row * s_cb + pos * s_cs + h * s_ch
            tl.store(dst + cols, o1)
            tl.store(dst + HALF + cols, o2)


def qk_norm_rope(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_weight: torch.Tensor, k_weight: torch.Tensor,
                 eps: float, order: str, cos: torch.Tensor, sin: torch.Tensor, *,
                 k_cache: torch.Tensor | None = None, v_cache: torch.Tensor | None = None,
                 rows: torch.Tensor | None = None,
                 positions: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``rope(qk_norm(q))``, ``rope(qk_norm(k))`` and, with a cache, the K/V cache write, in one launch.

    Parameters
    ----------
    q : [T, H, D], k, v : [T, Hkv, D] bfloat16, unit stride on D (views of the packed q/k/v product
        are fine). q_weight, k_weight : [D] bfloat16. eps, order : as for ``qk_norm``
        (``"hf"`` or ``"fused"``). cos, sin : [T, D/2] float32 (:meth:`Qwen3Model.rope_tables`).
    k_cache, v_cache : [B, S_max, Hkv, D] bfloat16, unit stride on D; rows, positions : [T] int64
        on the same device, the cache row and slot of each token, which the caller validated (the
        engine's plan, :meth:`Qwen3Model.check_positions`): the kernel reads them on the device and
        does not check them again, so the call can be captured in a CUDA graph. All four or none;
        the cache stores the rotated K and ``v`` as they are.

    Returns
    -------
    (q_out [T, H, D], k_out [T, Hkv, D]) bfloat16: bitwise ``rope(qk_norm(q, q_weight, eps, order),
    cos, sin)`` of ``triton_cuda_bf16`` and the same for k (FP32 inside, rounded where the separate
    ops round; tested), and the cache bitwise the indexed stores of k_out and v.

    Raises
    ------
    InputError
        Shapes, dtypes, devices or strides other than the above, D odd or D/2 not a power of two,
        an unknown ``order``, or part of the cache arguments.
    """
    from rl_engine.ops.rms_norm.triton import LANES

    q_out, k_out, cache, cached = _prepare_qk_norm_rope(q, k, v, q_weight, k_weight, eps, order, cos, sin, k_cache,
                                                        v_cache, rows, positions)
    t, h, d = q.shape
    hkv = k.shape[1]
    if t == 0 or h + hkv == 0:
        return q_out, k_out
    kc, vc, rw, ps, *cs = cache
    _qk_norm_rope_kernel[(t, h + 2 * hkv)](
        q, k, v, q_weight, k_weight, cos, sin, q_out, k_out, kc, vc, rw, ps, h, hkv, float(eps), float(d),
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1), cos.stride(0), sin.stride(0),
        q_out.stride(0), q_out.stride(1), k_out.stride(0), k_out.stride(1), *cs,
        D=d, HALF=d // 2, HF_ORDER=order == "hf", LANES=LANES, CHUNKS=cdiv(d, LANES), CACHE=cached,
        num_warps=4, enable_fp_fusion=FP_FUSION)
    return q_out, k_out


def _prepare_qk_norm_rope(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_weight: torch.Tensor,
                          k_weight: torch.Tensor, eps: float, order: str, cos: torch.Tensor, sin: torch.Tensor,
                          k_cache: torch.Tensor | None, v_cache: torch.Tensor | None, rows: torch.Tensor | None,
                          positions: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor, tuple, bool]:
    """Validate :func:`qk_norm_rope`'s arguments (InputError) and allocate its outputs; returns
    ``(q_out, k_out, cache arguments, cached)``: the cache arguments are ``(k_cache, v_cache, rows,
    positions, six cache strides)``, or, without a cache, pointers the kernels never read and zero
    strides."""
    from rl_engine.ops.rms_norm.op import check_eps_order

    if q.dim() != 3 or k.dim() != 3:
        raise InputError(f"qk_norm_rope: q and k must be [T, H, D], got {list(q.shape)} and {list(k.shape)}")
    t, h, d = q.shape
    hkv = k.shape[1]
    dev = q.device
    _check_rows("qk_norm_rope q", q, (t, h, d), dev)
    _check_rows("qk_norm_rope k", k, (t, hkv, d), dev)
    _check_rows("qk_norm_rope v", v, (t, hkv, d), dev)
    _check_rows("qk_norm_rope q_weight", q_weight, (d,), dev)
    _check_rows("qk_norm_rope k_weight", k_weight, (d,), dev)
    check_eps_order(eps, order)
    half = d // 2
    if d % 2 or half & (half - 1):
        raise InputError(f"qk_norm_rope: D = {d} must be even with D/2 a power of two")
    for name, tab in (("cos", cos), ("sin", sin)):
        if tab.dtype != torch.float32 or tuple(tab.shape) != (t, half) or tab.device != dev or tab.stride(-1) != 1:
            raise InputError(f"qk_norm_rope {name}: expected float32 [{t}, {half}] on {dev} with unit stride, got "
                             f"{tab.dtype} {list(tab.shape)} on {tab.device}")
    cached = [x is not None for x in (k_cache, v_cache, rows, positions)]
    if any(cached) and not all(cached):
        raise InputError("qk_norm_rope: k_cache, v_cache, rows and positions go together")
    q_out = torch.empty((t, h, d), dtype=torch.bfloat16, device=dev)
    k_out = torch.empty((t, hkv, d), dtype=torch.bfloat16, device=dev)
    if not all(cached):
        return q_out, k_out, (k_out, k_out, cos, cos, *(0,) * 6), False
    _check_cache("qk_norm_rope", k_cache, v_cache, rows, positions, t, hkv, d, dev)
    kc, vc = k_cache, v_cache
    strides = (kc.stride(0), kc.stride(1), kc.stride(2), vc.stride(0), vc.stride(1), vc.stride(2))
    return q_out, k_out, (kc, vc, rows, positions, *strides), True


CUDA_QK_NORM_ROPE_MAX_D = 256
"""Largest head dim of :func:`qk_norm_rope_cuda` (two columns per thread of its 128)."""


def qk_norm_rope_cuda(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_weight: torch.Tensor,
                      k_weight: torch.Tensor, eps: float, order: str, cos: torch.Tensor, sin: torch.Tensor, *,
                      k_cache: torch.Tensor | None = None, v_cache: torch.Tensor | None = None,
                      rows: torch.Tensor | None = None,
                      positions: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`qk_norm_rope` on the ``cuda_bf16`` backend (``rl_qk_norm_rope_fwd``): bitwise that
    backend's ``rope(qk_norm(q))``, ``rope(qk_norm(k))`` and indexed cache stores (the norm's FP32
    sum, IEEE division and square root and roundings, then the rotation's two FP32 products and
    one addition, rounded once; the cache gets copies).

    Same shapes, dtypes and errors as :func:`qk_norm_rope`, and D <= :data:`CUDA_QK_NORM_ROPE_MAX_D`
    (InputError above it, before any launch); BackendUnavailable without an sm_90 GPU.
    """
    from rl_engine.backends.cuda_launch import check_cuda_device, launch

    q_out, k_out, cache, cached = _prepare_qk_norm_rope(q, k, v, q_weight, k_weight, eps, order, cos, sin, k_cache,
                                                        v_cache, rows, positions)
    t, h, d = q.shape
    hkv = k.shape[1]
    if d > CUDA_QK_NORM_ROPE_MAX_D:
        raise InputError(f"qk_norm_rope_cuda: D = {d} is above the kernel's {CUDA_QK_NORM_ROPE_MAX_D}")
    check_cuda_device(q, k, v, cos)
    if t == 0 or h + hkv == 0:
        return q_out, k_out
    kc, vc, rw, ps, *cs = cache
    launch(q.device, "rl_qk_norm_rope_fwd", q, k, v, q_weight, k_weight, cos, sin, q_out, k_out, kc, vc, rw, ps, t, h,
           hkv, d, q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1), cos.stride(0),
           sin.stride(0), q_out.stride(0), q_out.stride(1), k_out.stride(0), k_out.stride(1), *cs, float(eps),
           1 if order == "hf" else 0, int(cached))
    return q_out, k_out


CUDA_FUSED_ON = True
"""Whether the ``cuda_bf16`` decode table takes :func:`add_rms_norm_cuda` and
:func:`qk_norm_rope_cuda` (the separate ops' bits, with controls, in the host emulation and on the
H200)."""


CUDA_DECODE_PDL = 2
"""The PDL mode (programmatic dependent launch, :func:`rl_engine.backends.cuda_launch.set_programmatic_launch`)
of ``cuda_bf16``'s decode forwards on a GPU of at most :data:`CUDA_DECODE_PDL_MAX_BATCH` rows
(:func:`decode_launch_scope`): 2 lets each decode kernel start while the one before it finishes,
copying its weight meanwhile; 0 launches plainly. The bits do not depend on it (tested on the H200
at Qwen3-8B layer shapes, B = 1 and 16, eager and 20 graph replays)."""

CUDA_DECODE_PDL_MAX_BATCH = 64
"""The largest decode batch that runs in :data:`CUDA_DECODE_PDL`. Since the warpgroup GEMV keeps the
PDL rules (b6a5dfe), B = 64 runs in mode 2 too: its Qwen3-8B step (context 1024) 8.73-8.77 ms
against 9.01 plain (``evidence/2026-12-02-h200-decode-9b35315``). Before, on the H200
(``evidence/2026-12-02-h200-decode-26d40ec``), Qwen3-8B graph steps, plain against mode 2:
5.47 against 5.00 ms at B = 1 (context 1024), 7.22 against 7.12 ms at B = 8, and at B = 16 7.73
against 7.60 ms (context 1024) and 15.10 against 14.94 ms (context 8192) with the decode attention
launched plainly, as its launcher does past batch 8 (``DECODE_PDL_MAX_BATCH`` in
``cuda_src/attention.cu``: with it under PDL B = 16 context 8192 took 18.8 ms)."""


def decode_launch_scope(backend: str, device: torch.device, batch: int) -> contextlib.AbstractContextManager[None]:
    """The launch mode of one decode forward of ``batch`` rows of ``backend`` on ``device``:
    ``cuda_bf16`` on a GPU with ``batch <= CUDA_DECODE_PDL_MAX_BATCH`` runs in PDL mode
    :data:`CUDA_DECODE_PDL` (a decode forward writes no weight, which mode 2 needs); anything
    else as it is. Inside ``torch.compile`` the scope is empty: setting the mode is a call into the
    loaded library (ctypes, behind a lock) that Dynamo cannot trace, and the bits do not depend on
    the mode, so a compiled decode forward launches in the process's mode (0 unless set outside)."""
    if torch.compiler.is_compiling():
        return contextlib.nullcontext()
    if backend == "cuda_bf16" and device.type == "cuda" and CUDA_DECODE_PDL and batch <= CUDA_DECODE_PDL_MAX_BATCH:
        from rl_engine.backends.cuda_launch import programmatic_launch

        return programmatic_launch(CUDA_DECODE_PDL)
    return contextlib.nullcontext()


def fused_decode_impls(backend: str, *, switched_off_too: bool = False) -> dict[str, Callable[..., Any]]:
    """The fused implementations ``backend`` has, by op-table name (``add_rms_norm``,
    ``qk_norm_rope``); empty for a backend without them, and for ``cuda_bf16`` while
    :data:`CUDA_FUSED_ON` is off unless ``switched_off_too`` (tests)."""
    if backend == "cuda_bf16" and (CUDA_FUSED_ON or switched_off_too):
        return {"add_rms_norm": add_rms_norm_cuda, "qk_norm_rope": qk_norm_rope_cuda}
    if backend == "triton_cuda_bf16":
        return {"add_rms_norm": add_rms_norm, "qk_norm_rope": qk_norm_rope}
    return {}


__all__ = ["FUSED_BACKENDS", "add_rms_norm", "add_rms_norm_cuda", "decode_launch_scope", "fused_decode_impls",
           "qk_norm_rope", "qk_norm_rope_cuda"]
