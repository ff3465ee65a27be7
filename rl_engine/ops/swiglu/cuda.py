"""CUDA C++ SwiGLU (``cuda_bf16`` backend), forward and backward.

Kernels: ``rl_swiglu_fwd`` / ``rl_swiglu_bwd`` in ``rl_engine/backends/cuda_src/elementwise.cu``.
``y = gate / (1 + exp(-gate)) * up`` in FP32, one rounding (Shazeer 2020, "GLU Variants Improve
Transformer"; Hugging Face Qwen3MLP ``act_fn(gate_proj(x)) * up_proj(x)``). Backward with
``s = sigmoid(gate)``: ``dgate = dy * up * s * (1 + gate * (1 - s))``, ``dup = dy * gate * s``,
FP32, each rounded once. Elementwise: batch invariant by construction.
"""

from __future__ import annotations

import torch

from rl_engine.backends.cuda_launch import launch


def swiglu_fwd(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """y [T, F] bf16 of validated gate, up [T, F] bf16 (unit stride on F)."""
    t, f = gate.shape
    y = torch.empty((t, f), dtype=torch.bfloat16, device=gate.device)
    launch(gate.device, "rl_swiglu_fwd", gate, up, y, t, f, gate.stride(0), up.stride(0), y.stride(0))
    return y


def swiglu_bwd(gate: torch.Tensor, up: torch.Tensor, dy: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(dgate, dup) [T, F] bf16 of gate, up, dy [T, F] bf16 (unit stride on F)."""
    t, f = gate.shape
    dg = torch.empty((t, f), dtype=torch.bfloat16, device=gate.device)
    du = torch.empty((t, f), dtype=torch.bfloat16, device=gate.device)
    launch(gate.device, "rl_swiglu_bwd", gate, up, dy, dg, du, t, f, gate.stride(0), up.stride(0), dy.stride(0),
           dg.stride(0), du.stride(0))
    return dg, du
