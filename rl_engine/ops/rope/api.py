"""Public entry points for RoPE: the cos/sin tables and the rotation."""

from __future__ import annotations

import torch

from rl_engine.backends.registry import resolve_impl
from rl_engine.errors import InputError
from rl_engine.ops._validate import check_tensor


def inv_freq(theta: float, head_dim: int) -> torch.Tensor:
    """Inverse frequencies [D/2] float32: ``1 / theta ** (2i / D)``, i = 0 .. D/2 - 1.

    The formula of Hugging Face Qwen3 (``transformers`` ``_compute_default_rope_parameters``),
    evaluated in FP64 on the CPU and rounded once to FP32. Hugging Face evaluates it in FP32, and
    PyTorch's FP32 CPU ``pow`` gives different bits on hosts with and without AVX2 (measured:
    ``docs/cpu-interpreter.md``); the FP64 result rounded once is the same on every host and
    device, and within half an FP32 ulp of the exact value.

    Raises
    ------
    InputError
        ``head_dim`` is not a positive even integer or ``theta`` is not a positive number.
    """
    if isinstance(head_dim, bool) or not isinstance(head_dim, int) or head_dim <= 0 or head_dim % 2:
        raise InputError(f"head_dim: expected a positive even int, got {head_dim!r}")
    if isinstance(theta, bool) or not isinstance(theta, (int, float)) or not theta > 0:
        raise InputError(f"theta: expected a positive number, got {theta!r}")
    exponent = torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim
    return (1.0 / (float(theta) ** exponent)).to(torch.float32)


def cos_sin(positions: torch.Tensor, theta: float, head_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """FP32 cos and sin tables for RoPE. positions: [T] int64 -> (cos [T, D/2], sin [T, D/2]) float32.

    angle[t, i] = float32(positions[t]) * inv_freq[i] in FP32 (one FP32 multiply, as Hugging
    Face's FP32 ``inv_freq @ positions`` with K = 1), then FP32 ``cos``/``sin`` on the positions'
    device. Never in BF16: bf16(15962) = 15936 moves cos at frequency 0 from -0.908 to -0.268
    (pitfall P3). Hugging Face concatenates the D/2 table twice to width D; the kernels read the
    half table for both halves.

    Raises
    ------
    InputError
        positions is not a 1-D int64 tensor, or theta / head_dim are invalid (see :func:`inv_freq`).
    """
    check_tensor("positions", positions, dtype=torch.int64, ndim=1)
    freqs = inv_freq(theta, head_dim).to(positions.device)
    angle = positions.to(torch.float32)[:, None] * freqs[None, :]
    return torch.cos(angle), torch.sin(angle)


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, *, backend: str = "triton_cuda_bf16") -> torch.Tensor:
    """Rotate-half RoPE. x: [T, H, D] bfloat16, cos/sin: [T, D/2] float32 -> [T, H, D] bfloat16.

    ``out = [x1*cos - x2*sin, x2*cos + x1*sin]`` with ``x1 = x[..., :D/2]``, ``x2 = x[..., D/2:]``
    (Hugging Face Qwen3 ``apply_rotary_pos_emb``); FP32 math, one rounding. Backward: dx.

    ``backend`` is explicit; an unavailable backend raises BackendUnavailable naming why.
    """
    return resolve_impl("rope", backend)(x=x, cos=cos, sin=sin)
