"""RMSNorm, the op's one path: input checks, the torch ops ``rl_engine::rms_norm_fwd`` /
``rl_engine::rms_norm_bwd`` (fake shapes and autograd registered on them), the per-backend entry
points the op spec lists, and the public :func:`rms_norm`.

The kernels and their launchers live in ``triton.py`` and ``cuda.py`` (same launcher names and
signatures); the math both compute is ``docs/declared-arithmetic.md``'s. ``qk_norm`` runs the
same torch ops on the rows of a [T, H, D] tensor.
"""

from __future__ import annotations

import math

import torch

from rl_engine.errors import InputError
from rl_engine.ops._torch_op import call, check_device, grad_bf16, launchers, placeholder, register_autograd, run
from rl_engine.ops._validate import check_same_device, check_tensor

ORDERS = ("hf", "fused")
"""Rounding orders (contract ``declared_exceptions.rms_norm_rounding_order``; ``hf`` declared)."""


def check_eps_order(eps: object, order: object) -> None:
    """``eps`` a finite number >= 0 with no default anywhere (it comes from the model config:
    ``docs/pitfalls.md``, P12); ``order`` in :data:`ORDERS`. Raises InputError otherwise."""
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not math.isfinite(eps) or eps < 0:
        raise InputError(f"eps: expected a finite number >= 0 from the model config, got {eps!r}")
    if order not in ORDERS:
        raise InputError(f"order: expected one of {ORDERS}, got {order!r}")


def check_rows(x: torch.Tensor, weight: torch.Tensor, eps: object, order: object, ndim: int) -> None:
    """x [T, E] (``ndim`` 2) or [T, H, D] (``ndim`` 3) bfloat16 with unit stride on the last
    axis; weight bfloat16 [last axis] with unit stride; one device; eps and order as
    :func:`check_eps_order`. Raises InputError."""
    check_tensor("x", x, dtype=torch.bfloat16, ndim=ndim, contiguous_last=True)
    check_tensor("weight", weight, dtype=torch.bfloat16, shape=(x.shape[-1],), contiguous_last=True)
    check_same_device(x=x, weight=weight)
    check_eps_order(eps, order)


# ------------------------------------------------------------------------------------ torch ops
def _rows(x: torch.Tensor) -> int:
    return x.shape[0] * (x.shape[1] if x.dim() == 3 else 1)


def _rms_norm_fwd(x: torch.Tensor, weight: torch.Tensor, eps: float, hf: bool, split: int,
                 backend: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows of x ([T, E] or [T, H, D], validated) -> (y like x BF16, rstd [rows] FP32)."""
    return launchers("rms_norm", backend).rms_norm_fwd(x, weight, eps, hf, split)


rms_norm_fwd = torch.library.custom_op("rl_engine::rms_norm_fwd", _rms_norm_fwd, mutates_args=())


@rms_norm_fwd.register_fake
def _(x, weight, eps, hf, split, backend):
    return x.new_empty(x.shape, dtype=torch.bfloat16), x.new_empty((_rows(x),), dtype=torch.float32)


@torch.library.custom_op("rl_engine::rms_norm_bwd", mutates_args=())
def rms_norm_bwd(x: torch.Tensor, weight: torch.Tensor, dy: torch.Tensor, rstd: torch.Tensor, need_dx: bool,
                 need_dw: bool, backend: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(dx like x, dweight [E]) BF16; a gradient not asked for is a 0-element tensor."""
    dx, dw = launchers("rms_norm", backend).rms_norm_bwd(x, weight, dy, rstd, need_dx, need_dw)
    return placeholder(dx, need_dx, x), placeholder(dw, need_dw, x)


@rms_norm_bwd.register_fake
def _(x, weight, dy, rstd, need_dx, need_dw, backend):
    return (x.new_empty(x.shape if need_dx else (0,), dtype=torch.bfloat16),
            x.new_empty((x.shape[-1],) if need_dw else (0,), dtype=torch.bfloat16))


def _setup(ctx, inputs, output):
    x, weight, _eps, _hf, _split, backend = inputs
    ctx.save_for_backward(x, weight, output[1])
    ctx.backend = backend


def _backward(ctx, dy, _drstd):
    x, weight, rstd = ctx.saved_tensors
    need_dx, need_dw = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
    dx, dw = call(rms_norm_bwd, x, weight, grad_bf16(dy), rstd, need_dx, need_dw, ctx.backend)
    return (dx if need_dx else None), (dw if need_dw else None), None, None, None, None


register_autograd(rms_norm_fwd, _rms_norm_fwd, _backward, _setup)


# ---------------------------------------------- residual add + RMSNorm (training, both backends)
def _add_rms_norm_fwd(x: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor, eps: float, hf: bool,
                      backend: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(s = x + delta, y = rms_norm(s), rstd [T] FP32) of validated [T, E] rows. Triton: one launch
    (:func:`rl_engine.ops.rms_norm.triton.add_rms_norm_train_fwd`); a backend without it adds with
    ``torch.add`` (the same rounding) and runs its norm."""
    mod = launchers("rms_norm", backend)
    if getattr(mod, "FUSED_ADD_NORM", False):
        return mod.add_rms_norm_train_fwd(x, delta, weight, eps, hf)
    s = x + delta
    y, rstd = mod.rms_norm_fwd(s, weight, eps, hf)
    return s, y, rstd


add_rms_norm_fwd = torch.library.custom_op("rl_engine::add_rms_norm_fwd", _add_rms_norm_fwd, mutates_args=())


@add_rms_norm_fwd.register_fake
def _(x, delta, weight, eps, hf, backend):
    return (x.new_empty(x.shape, dtype=torch.bfloat16), x.new_empty(x.shape, dtype=torch.bfloat16),
            x.new_empty((x.shape[0],), dtype=torch.float32))


@torch.library.custom_op("rl_engine::add_rms_norm_bwd", mutates_args=())
def add_rms_norm_bwd(s: torch.Tensor, weight: torch.Tensor, dy: torch.Tensor, rstd: torch.Tensor,
                     ds: torch.Tensor | None, need_dx: bool, need_dw: bool,
                     backend: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(dx, dweight) BF16: the norm's backward on s with the residual gradient ``ds`` (None: none)
    added to its BF16 dx in FP32 and rounded once: autograd's sum of the two gradients of ``s``
    in the separate ops, so the same bits. dx is the gradient of both x and delta."""
    mod = launchers("rms_norm", backend)
    if ds is not None and getattr(mod, "FUSED_ADD_NORM", False):  # the Triton kernels add it in the store
        dx, dw = mod.rms_norm_bwd(s, weight, dy, rstd, need_dx, need_dw, residual_grad=ds)
    else:
        dx, dw = mod.rms_norm_bwd(s, weight, dy, rstd, need_dx, need_dw)
        if ds is not None and need_dx:
            dx = dx + ds
    return placeholder(dx, need_dx, s), placeholder(dw, need_dw, s)


@add_rms_norm_bwd.register_fake
def _(s, weight, dy, rstd, ds, need_dx, need_dw, backend):
    return (s.new_empty(s.shape if need_dx else (0,), dtype=torch.bfloat16),
            s.new_empty((s.shape[-1],) if need_dw else (0,), dtype=torch.bfloat16))


def _add_setup(ctx, inputs, output):
    _x, _delta, weight, _eps, _hf, backend = inputs
    s, _y, rstd = output
    ctx.save_for_backward(s, weight, rstd)
    ctx.backend = backend
    ctx.set_materialize_grads(False)  # an unused s (the last layer's) gets no gradient: none is added


def _add_backward(ctx, ds, dy, _drstd):
    s, weight, rstd = ctx.saved_tensors
    need_dx = ctx.needs_input_grad[0] or ctx.needs_input_grad[1]
    need_dw = ctx.needs_input_grad[2] and dy is not None
    ds = None if ds is None else grad_bf16(ds)
    if dy is None:  # y unused: the residual gradient passes through the add
        dx, dw = ds, None
    else:
        dx, dw = call(add_rms_norm_bwd, s, weight, grad_bf16(dy), rstd, ds, need_dx, need_dw, ctx.backend)
    dx = dx if need_dx else None
    return (dx if ctx.needs_input_grad[0] else None), (dx if ctx.needs_input_grad[1] else None), \
        (dw if need_dw else None), None, None, None


register_autograd(add_rms_norm_fwd, _add_rms_norm_fwd, _add_backward, _add_setup)


def add_rms_norm_kernel(x: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor, eps: float, order: str = "hf", *,
                        backend: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The residual add and the next RMSNorm, differentiable: ``(s, y)`` with ``s = x + delta``
    and ``y = rms_norm(s, weight, eps, order)``, bitwise the two separate ops forward and
    backward (the training form of :func:`rl_engine.chain.fused.add_rms_norm`).

    x, delta: [T, E] bfloat16 (unit stride on E), weight: [E] bfloat16 -> s, y: [T, E] bfloat16.
    FP32 inside: the add (rounded once, as ``torch.add``), the norm's declared arithmetic
    (``docs/declared-arithmetic.md``). Backward: the norm's dx rounded to BF16 plus the gradient
    of s, in FP32, rounded once (autograd's sum of the two gradients of the separate ops' s), as
    the gradient of both x and delta; dweight as :func:`rms_norm_kernel`. Both backends run one
    kernel forward and add the residual gradient in the norm's dx kernel (``cuda_bf16`` for E <=
    8192; longer rows run ``torch.add`` and its norm kernels, the same bits).

    Raises
    ------
    InputError
        As :func:`rms_norm_kernel` for x, weight, eps and order; delta not bfloat16 [T, E] with unit
        stride on E on x's device. Checked before any launch.
    BackendUnavailable
        As :func:`rms_norm_kernel`.
    """
    check_rows(x, weight, eps, order, 2)
    check_tensor("delta", delta, dtype=torch.bfloat16, shape=tuple(x.shape), contiguous_last=True)
    check_same_device(x=x, delta=delta)
    check_device(backend, x, delta, weight)
    s, y, _ = run(add_rms_norm_fwd, _add_rms_norm_fwd, x, delta, weight, float(eps), order == "hf", backend)
    return s, y


# ------------------------------------------------ QK-norm + RoPE (training, both backends)
def _norm_rope_fwd(x: torch.Tensor, weight: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, eps: float, hf: bool,
                   backend: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(y = rope(qk_norm(x)) [T, H, D] BF16, rstd [T * H] FP32) of validated rows. Triton: one
    launch (:func:`rl_engine.ops.rms_norm.triton.norm_rope_train_fwd`); a backend without it runs
    its norm, then its rotation of the norm's BF16 output (the separate ops)."""
    mod = launchers("rms_norm", backend)
    if getattr(mod, "FUSED_NORM_ROPE", False):
        return mod.norm_rope_train_fwd(x, weight, cos, sin, eps, hf)
    yn, rstd = mod.rms_norm_fwd(x, weight, eps, hf)
    return launchers("rope", backend).rope_rotate(yn, cos, sin, False), rstd


norm_rope_fwd = torch.library.custom_op("rl_engine::norm_rope_fwd", _norm_rope_fwd, mutates_args=())


@norm_rope_fwd.register_fake
def _(x, weight, cos, sin, eps, hf, backend):
    return x.new_empty(x.shape, dtype=torch.bfloat16), x.new_empty((_rows(x),), dtype=torch.float32)


@torch.library.custom_op("rl_engine::norm_rope_bwd", mutates_args=())
def norm_rope_bwd(x: torch.Tensor, weight: torch.Tensor, dy: torch.Tensor, rstd: torch.Tensor, cos: torch.Tensor,
                  sin: torch.Tensor, need_dx: bool, need_dw: bool, backend: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(dx like x, dweight [D]) BF16 from the gradient ``dy`` of the rotated output: the rotation's
    backward (by -sin, rounded to BF16) then the norm's backward, bitwise the separate ops'
    backward. Triton: inside the norm's backward kernels (each load of dy rotates it back); a
    backend without it runs the rotation, then its norm backward."""
    mod = launchers("rms_norm", backend)
    if getattr(mod, "FUSED_NORM_ROPE", False):
        dx, dw = mod.rms_norm_bwd(x, weight, dy, rstd, need_dx, need_dw, rope=(cos, sin))
    else:
        g = launchers("rope", backend).rope_rotate(dy, cos, sin, True)
        dx, dw = mod.rms_norm_bwd(x, weight, g, rstd, need_dx, need_dw)
    return placeholder(dx, need_dx, x), placeholder(dw, need_dw, x)


@norm_rope_bwd.register_fake
def _(x, weight, dy, rstd, cos, sin, need_dx, need_dw, backend):
    return (x.new_empty(x.shape if need_dx else (0,), dtype=torch.bfloat16),
            x.new_empty((x.shape[-1],) if need_dw else (0,), dtype=torch.bfloat16))


def _rope_setup(ctx, inputs, output):
    x, weight, cos, sin, _eps, _hf, backend = inputs
    ctx.save_for_backward(x, weight, output[1], cos, sin)
    ctx.backend = backend


def _rope_backward(ctx, dy, _drstd):
    x, weight, rstd, cos, sin = ctx.saved_tensors
    need_dx, need_dw = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
    dx, dw = call(norm_rope_bwd, x, weight, grad_bf16(dy), rstd, cos, sin, need_dx, need_dw, ctx.backend)
    return (dx if need_dx else None), (dw if need_dw else None), None, None, None, None, None


register_autograd(norm_rope_fwd, _norm_rope_fwd, _rope_backward, _rope_setup)


def norm_rope_rows(x: torch.Tensor, weight: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, eps: float,
                   order: str, backend: str) -> torch.Tensor:
    """Run validated [T, H, D] rows and rope tables on ``backend``: ``rope(qk_norm(x))``,
    differentiable. Used by :func:`rl_engine.ops.qk_norm.op.qk_norm_rope_kernel`."""
    check_device(backend, x, weight, cos, sin)
    return run(norm_rope_fwd, _norm_rope_fwd, x, weight, cos, sin, float(eps), order == "hf", backend)[0]


def rms_norm_rows(x: torch.Tensor, weight: torch.Tensor, eps: float, order: str, backend: str,
                  split: int = 0) -> torch.Tensor:
    """Run validated rows ([T, E] or [T, H, D]) on ``backend``; ``split`` > 0 only for the
    negative control. Shared with ``qk_norm``."""
    check_device(backend, x, weight)
    return run(rms_norm_fwd, _rms_norm_fwd, x, weight, float(eps), order == "hf", split, backend)[0]


# ---------------------------------------------------------------------------- entry points
def rms_norm_kernel(x: torch.Tensor, weight: torch.Tensor, eps: float, order: str = "hf", *,
                    backend: str) -> torch.Tensor:
    """RMSNorm over E on a kernel backend. x: [T, E] bfloat16, weight: [E] bfloat16 -> [T, E] bfloat16.

    Statistics in FP32: one fixed-order row sum of ``x^2`` (128 lane sums, a fixed pairwise tree;
    the order depends only on E), ``rstd = 1 / sqrt(sum / E + eps)`` with IEEE division and
    square root. Then ``order="hf"``: ``bf16(weight * bf16(x * rstd))`` (Hugging Face
    Qwen3RMSNorm, the declared order) or ``order="fused"``: ``bf16(x * rstd * weight)``.
    ``eps`` has no default (``docs/pitfalls.md``, P12). Backward (FP32 math, one rounding each):
    dx [T, E] and dweight [E] bfloat16, dweight reduced over T in fixed chunks of 64 rows without
    atomics. Both backends compute the same function (``docs/declared-arithmetic.md``), so they
    give the same bits.

    Raises
    ------
    InputError
        x is not a 2-D bfloat16 tensor with unit stride on E; weight is not bfloat16 [E] with unit
        stride; devices differ; eps is not a finite number >= 0; order is not "hf" or "fused".
        Checked before any launch.
    BackendUnavailable
        ``triton_cuda_bf16``: the tensors are not on a CUDA device (and the Triton interpreter is
        off). ``cuda_bf16``: no CUDA GPU of compute capability 9.0, tensors not on it, or ``nvcc``
        missing for the build.
    """
    check_rows(x, weight, eps, order, 2)
    return rms_norm_rows(x, weight, eps, order, backend)


def rms_norm_triton(x: torch.Tensor, weight: torch.Tensor, eps: float, order: str = "hf") -> torch.Tensor:
    """:func:`rms_norm_kernel` on ``triton_cuda_bf16``."""
    return rms_norm_kernel(x, weight, eps, order, backend="triton_cuda_bf16")


def rms_norm_cuda(x: torch.Tensor, weight: torch.Tensor, eps: float, order: str = "hf") -> torch.Tensor:
    """:func:`rms_norm_kernel` on ``cuda_bf16``."""
    return rms_norm_kernel(x, weight, eps, order, backend="cuda_bf16")


CONTROL_SPLIT_BELOW = 4
"""The negative control splits the row reduction when T < this (a 'decode' heuristic)."""


def rms_norm_size_dependent_control(x: torch.Tensor, weight: torch.Tensor, eps: float,
                                    order: str = "hf") -> torch.Tensor:
    """NEGATIVE CONTROL, deliberately NOT batch-invariant (Triton only): for T < 4 the mean of
    squares is split into 4 parts with BF16-rounded partial sums (a split chosen from T). The
    batch transform must catch it. Same signature and validation as :func:`rms_norm_triton`."""
    check_rows(x, weight, eps, order, 2)
    return rms_norm_rows(x, weight, eps, order, "triton_cuda_bf16",
                         split=4 if x.shape[0] < CONTROL_SPLIT_BELOW else 0)
