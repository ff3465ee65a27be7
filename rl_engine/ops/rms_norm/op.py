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
