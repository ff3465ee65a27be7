"""RoPE, the op's one path: the cos/sin tables, input checks, the torch op
``rl_engine::rope_rotate`` (fake shape and autograd registered: the backward of a rotation is the
rotation by ``-sin``, the same op), the per-backend entry points the op spec lists, and the public
:func:`rope`. Kernels and launchers: ``triton.py``, ``cuda.py``.
"""

from __future__ import annotations

import torch

from rl_engine.errors import InputError
from rl_engine.ops._torch_op import call, check_device, grad_bf16, launchers, register_autograd, run
from rl_engine.ops._validate import check_same_device, check_tensor


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
    (``docs/pitfalls.md``, P3). Hugging Face concatenates the D/2 table twice to width D; the kernels read the
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


def validate_rope_inputs(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> None:
    """x [T, H, D] bfloat16 with unit stride on D and D even; cos / sin float32 [T, D/2] with unit
    stride on the last axis; one device. Raises InputError before any launch."""
    check_tensor("x", x, dtype=torch.bfloat16, ndim=3, contiguous_last=True)
    t, _, d = x.shape
    if d % 2:
        raise InputError(f"x: head dim D must be even for rotate-half RoPE, got shape {list(x.shape)}")
    check_tensor("cos", cos, dtype=torch.float32, shape=(t, d // 2), contiguous_last=True)
    check_tensor("sin", sin, dtype=torch.float32, shape=(t, d // 2), contiguous_last=True)
    check_same_device(x=x, cos=cos, sin=sin)


def _rope_rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, neg_sin: bool, backend: str) -> torch.Tensor:
    """y [T, H, D] bf16: x rotated by (cos, sin), or by (cos, -sin) when ``neg_sin``."""
    return launchers("rope", backend).rope_rotate(x, cos, sin, neg_sin)


rope_rotate = torch.library.custom_op("rl_engine::rope_rotate", _rope_rotate, mutates_args=())


@rope_rotate.register_fake
def _(x, cos, sin, neg_sin, backend):
    return x.new_empty(x.shape, dtype=torch.bfloat16)


def _setup(ctx, inputs, output):
    _x, cos, sin, neg_sin, backend = inputs
    ctx.save_for_backward(cos, sin)
    ctx.neg_sin, ctx.backend = neg_sin, backend


def _backward(ctx, dy):
    cos, sin = ctx.saved_tensors
    return call(rope_rotate, grad_bf16(dy), cos, sin, not ctx.neg_sin, ctx.backend), None, None, None, None


register_autograd(rope_rotate, _rope_rotate, _backward, _setup)


def rope_kernel(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, *, backend: str) -> torch.Tensor:
    """RoPE on a kernel backend. x: [T, H, D] bfloat16, cos/sin: [T, D/2] float32 -> [T, H, D] bfloat16.

    ``out = [x1*cos - x2*sin, x2*cos + x1*sin]`` (Hugging Face Qwen3 rotate-half), FP32 math
    without fused multiply-adds (contract ``declared_exceptions.fp_contraction``), one rounding to
    BF16. Backward: dx [T, H, D] bfloat16, the rotation by ``-sin`` (cos/sin take no gradient).

    Raises
    ------
    InputError
        x is not a 3-D bfloat16 tensor with unit stride on D, D is odd, cos/sin are not float32
        [T, D/2] with unit stride on the last axis, or the tensors sit on different devices.
    BackendUnavailable
        ``triton_cuda_bf16``: the tensors are not on a CUDA device (and the Triton interpreter is
        off). ``cuda_bf16``: no CUDA GPU of compute capability 9.0, tensors not on it, or ``nvcc``
        missing.
    """
    validate_rope_inputs(x, cos, sin)
    check_device(backend, x, cos, sin)
    return run(rope_rotate, _rope_rotate, x, cos, sin, False, backend)


def rope_triton(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """:func:`rope_kernel` on ``triton_cuda_bf16``."""
    return rope_kernel(x, cos, sin, backend="triton_cuda_bf16")


def rope_cuda(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """:func:`rope_kernel` on ``cuda_bf16``."""
    return rope_kernel(x, cos, sin, backend="cuda_bf16")
