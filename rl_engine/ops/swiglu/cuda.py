"""CUDA C++ SwiGLU (``cuda_bf16`` backend), forward and backward.

Kernels: ``rl_swiglu_fwd`` / ``rl_swiglu_bwd`` in ``rl_engine/backends/cuda_src/elementwise.cu``.
``y = gate / (1 + exp(-gate)) * up`` in FP32, one rounding (Shazeer 2020, "GLU Variants Improve
Transformer"; Hugging Face Qwen3MLP ``act_fn(gate_proj(x)) * up_proj(x)``). Backward with
``s = sigmoid(gate)``: ``dgate = dy * up * s * (1 + gate * (1 - s))``, ``dup = dy * gate * s``,
FP32, each rounded once. Elementwise: batch invariant by construction.
"""

from __future__ import annotations

import torch

from rl_engine.backends.cuda_launch import check_cuda_device, launch, unit_last
from rl_engine.errors import InputError
from rl_engine.ops._validate import check_same_device, check_tensor


def _fwd(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    t, f = gate.shape
    y = torch.empty((t, f), dtype=torch.bfloat16, device=gate.device)
    launch(gate.device, "rl_swiglu_fwd", gate, up, y, t, f, gate.stride(0), up.stride(0), y.stride(0))
    return y


def _bwd(gate: torch.Tensor, up: torch.Tensor, dy: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    t, f = gate.shape
    dg = torch.empty((t, f), dtype=torch.bfloat16, device=gate.device)
    du = torch.empty((t, f), dtype=torch.bfloat16, device=gate.device)
    launch(gate.device, "rl_swiglu_bwd", gate, up, dy, dg, du, t, f, gate.stride(0), up.stride(0), dy.stride(0),
           dg.stride(0), du.stride(0))
    return dg, du


class _SwigluCuda(torch.autograd.Function):
    @staticmethod
    def forward(ctx, gate, up):
        ctx.save_for_backward(gate, up)
        return _fwd(gate, up)

    @staticmethod
    def backward(ctx, dy):
        gate, up = ctx.saved_tensors
        return _bwd(gate, up, unit_last(dy.to(torch.bfloat16)))


def swiglu_cuda(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """SwiGLU with CUDA C++ kernels. gate, up: [T, F] bfloat16 (unit stride on F) -> [T, F] bfloat16.

    ``silu(gate) * up`` in FP32, one rounding to BF16. Backward: dgate, dup [T, F] bfloat16.

    Raises
    ------
    InputError
        gate or up is not a 2-D bfloat16 tensor with unit stride on F, their shapes differ, or
        they sit on different devices (checked before launch).
    BackendUnavailable
        No CUDA GPU of compute capability 9.0, tensors not on it, or ``nvcc`` missing.
    """
    check_tensor("gate", gate, dtype=torch.bfloat16, ndim=2, contiguous_last=True)
    check_tensor("up", up, dtype=torch.bfloat16, ndim=2, contiguous_last=True)
    if gate.shape != up.shape:
        raise InputError(f"gate and up must have the same shape [T, F], got {list(gate.shape)} and {list(up.shape)}")
    check_same_device(gate=gate, up=up)
    check_cuda_device(gate, up)
    return _SwigluCuda.apply(gate, up)
