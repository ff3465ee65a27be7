"""CUDA C++ RoPE, rotate-half (``cuda_bf16`` backend), forward and backward.

Kernel ``rl_rope`` in ``rl_engine/backends/cuda_src/elementwise.cu``: one block per (token, 4
heads); ``out = [x1*cos - x2*sin, x2*cos + x1*sin]`` with each product and the sum rounded in FP32
(no fused multiply-add), one rounding to BF16 (Hugging Face Qwen3 ``apply_rotary_pos_emb``; FP32
cos/sin from :func:`rl_engine.ops.rope.cos_sin`, pitfall P3). The backward is the same rotation
with ``-sin`` (the transpose of a rotation; negation is exact). Batch invariant by construction.
"""

from __future__ import annotations

import torch

from rl_engine.backends.cuda_launch import check_cuda_device, launch, unit_last
from rl_engine.ops.rope.triton import validate_rope_inputs


def _launch(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, neg_sin: bool) -> torch.Tensor:
    t, h, d = x.shape
    y = torch.empty((t, h, d), dtype=torch.bfloat16, device=x.device)
    launch(x.device, "rl_rope", x, cos, sin, y, t, h, d, x.stride(0), x.stride(1), cos.stride(0), sin.stride(0),
           y.stride(0), y.stride(1), 1 if neg_sin else 0)
    return y


class _RopeCuda(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, cos, sin):
        ctx.save_for_backward(cos, sin)
        return _launch(x, cos, sin, False)

    @staticmethod
    def backward(ctx, dy):
        cos, sin = ctx.saved_tensors
        return _launch(unit_last(dy.to(torch.bfloat16)), cos, sin, True), None, None


def rope_cuda(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """RoPE with CUDA C++ kernels. x: [T, H, D] bfloat16, cos/sin: [T, D/2] float32 -> [T, H, D] bfloat16.

    ``out = [x1*cos - x2*sin, x2*cos + x1*sin]`` (rotate-half), FP32 math, one rounding. Backward:
    dx [T, H, D] bfloat16 (cos/sin take no gradient).

    Raises
    ------
    InputError
        x is not a 3-D bfloat16 tensor with unit stride on D, D is odd, cos/sin are not float32
        [T, D/2] with unit stride on the last axis, or the tensors sit on different devices.
    BackendUnavailable
        No CUDA GPU of compute capability 9.0, tensors not on it, or ``nvcc`` missing.
    """
    validate_rope_inputs(x, cos, sin)
    check_cuda_device(x, cos, sin)
    return _RopeCuda.apply(x, cos, sin)
