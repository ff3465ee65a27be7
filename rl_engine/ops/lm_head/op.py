"""lm_head, the op's one path: input checks, the torch ops ``rl_engine::lm_head_fwd`` /
``rl_engine::lm_head_bwd`` (fake shapes and autograd registered), the per-backend entry points
the op spec lists, and the public :func:`lm_head`. Kernels and launchers: ``triton.py``,
``cuda.py``.
"""

from __future__ import annotations

import torch

from rl_engine.errors import InputError
from rl_engine.ops._torch_op import call, check_device, launchers, placeholder, register_autograd, run
from rl_engine.ops._validate import check_same_device, check_tensor


def _lm_head_fwd(hidden: torch.Tensor, weight: torch.Tensor, backend: str) -> torch.Tensor:
    """logits [T, V] fp32 of validated hidden [T, E], weight [V, E] bf16."""
    return launchers("lm_head", backend).lm_head_fwd(hidden, weight)


lm_head_fwd = torch.library.custom_op("rl_engine::lm_head_fwd", _lm_head_fwd, mutates_args=())


@lm_head_fwd.register_fake
def _(hidden, weight, backend):
    return hidden.new_empty((hidden.shape[0], weight.shape[0]), dtype=torch.float32)


@torch.library.custom_op("rl_engine::lm_head_bwd", mutates_args=())
def lm_head_bwd(hidden: torch.Tensor, weight: torch.Tensor, dlogits: torch.Tensor, need_dh: bool, need_dw: bool,
                backend: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(dhidden [T, E], dweight [V, E]) bf16 from FP32 dlogits; a gradient not asked for is a
    0-element tensor."""
    dh, dw = launchers("lm_head", backend).lm_head_bwd(hidden, weight, dlogits, need_dh, need_dw)
    return placeholder(dh, need_dh, hidden), placeholder(dw, need_dw, hidden)


@lm_head_bwd.register_fake
def _(hidden, weight, dlogits, need_dh, need_dw, backend):
    return (hidden.new_empty(hidden.shape if need_dh else (0,), dtype=torch.bfloat16),
            hidden.new_empty(weight.shape if need_dw else (0,), dtype=torch.bfloat16))


def _setup(ctx, inputs, output):
    hidden, weight, backend = inputs
    ctx.save_for_backward(hidden, weight)
    ctx.backend = backend


def _backward(ctx, dlogits):
    hidden, weight = ctx.saved_tensors
    need_dh, need_dw = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
    dh, dw = call(lm_head_bwd, hidden, weight, dlogits.to(torch.float32), need_dh, need_dw, ctx.backend)
    return (dh if need_dh else None), (dw if need_dw else None), None


register_autograd(lm_head_fwd, _lm_head_fwd, _backward, _setup)


def lm_head_kernel(hidden: torch.Tensor, weight: torch.Tensor, *, backend: str) -> torch.Tensor:
    """FP32 logits on a kernel backend. hidden: [T, E] bfloat16 (unit stride on E), weight: [V, E]
    bfloat16 (any strides) -> logits [T, V] float32.

    FP32 accumulation over all of E in increasing order (BF16 x BF16 products, exact in FP32),
    FP32 output (contract ``logits_for_scoring``; ``docs/pitfalls.md``, P5). Backward with FP32
    upstream dlogits [T, V]: dhidden [T, E] and dweight [V, E] bfloat16, FP32 operands and
    accumulation, one rounding.

    Raises
    ------
    InputError
        hidden or weight is not a 2-D bfloat16 tensor, hidden has a non-unit stride on E, their E
        sizes differ, or they sit on different devices.
    BackendUnavailable
        ``triton_cuda_bf16``: the tensors are not on a CUDA device (and the Triton interpreter is
        off). ``cuda_bf16``: no CUDA GPU of compute capability 9.0, tensors not on it, or ``nvcc``
        missing.
    """
    check_tensor("hidden", hidden, dtype=torch.bfloat16, ndim=2, contiguous_last=True)
    check_tensor("weight", weight, dtype=torch.bfloat16, ndim=2)
    if hidden.shape[1] != weight.shape[1]:
        raise InputError(f"hidden is [T, E] = {list(hidden.shape)} but weight is [V, E] = {list(weight.shape)}: E differs")
    check_same_device(hidden=hidden, weight=weight)
    check_device(backend, hidden, weight)
    return run(lm_head_fwd, _lm_head_fwd, hidden, weight, backend)


def lm_head_triton(hidden: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """:func:`lm_head_kernel` on ``triton_cuda_bf16``."""
    return lm_head_kernel(hidden, weight, backend="triton_cuda_bf16")


def lm_head_cuda(hidden: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """:func:`lm_head_kernel` on ``cuda_bf16``."""
    return lm_head_kernel(hidden, weight, backend="cuda_bf16")
