"""No compiler-chosen FMA (contract ws1-c1-v4, declared_exceptions.fp_contraction).

The fault kind: a compiler that fuses ``a*b - c*d`` into ``fma(a, b, -(c*d))`` leaves one product
unrounded, so inputs whose exact answer is 0 because two products cancel give the product's
rounding error instead (pytorch/pytorch#122260). RoPE is the package's difference of products:
``x1*cos - x2*sin`` forward and ``dy2*cos - dy1*sin`` backward. With ``x1 = x2`` and
``cos = sin`` the exact result is +0 for every element whose product is inexact in FP32.

On the CPU the interpreter never fuses, so these tests bite on the GPU (both backends); the
negative control launches the same Triton kernel with Triton's default fusion on the GPU and
must see the residues.
"""

from __future__ import annotations

import pytest
import torch

from rl_engine.backends.registry import availability
from rl_engine.ops.rope import rope

T, H, D = 257, 8, 128


def _cancelling_inputs(device):
    g = torch.Generator().manual_seed(7)
    half = torch.randn((T, H, D // 2), generator=g, dtype=torch.float64).to(torch.bfloat16)
    x = torch.cat([half, half], dim=-1).to(device)
    # FP32 table values with a full 24-bit significand, so that bf16 * fp32 is inexact in FP32
    c = (torch.rand((T, D // 2), generator=g, dtype=torch.float64) * 0.9 + 0.05).to(torch.float32).to(device)
    return x, c, c.clone()


def _backends():
    return [b for b in ("triton_cuda_bf16", "cuda_bf16") if availability(b)[0]]


def _check_zero_first_half(y: torch.Tensor, what: str) -> None:
    first = y[..., : D // 2]
    bits = first.contiguous().view(torch.int16)
    nonzero = int((bits != 0).sum())
    assert nonzero == 0, (f"{what}: {nonzero} of {first.numel()} elements of x1*cos - x2*sin with x1 = x2, "
                          f"cos = sin are not +0 (max {float(first.float().abs().max()):.3e}): a fused multiply-add")


@pytest.mark.parametrize("backend", _backends())
def test_rope_forward_cancellation_is_exactly_zero(device, backend):
    x, cos, sin = _cancelling_inputs(device)
    _check_zero_first_half(rope(x, cos, sin, backend=backend), f"{backend} rope forward")


@pytest.mark.parametrize("backend", _backends())
def test_rope_backward_cancellation_is_exactly_zero(device, backend):
    x, cos, sin = _cancelling_inputs(device)
    x = x.clone().requires_grad_(True)
    y = rope(x, cos, sin, backend=backend)
    dy = x.detach().clone()  # dy1 = dy2: dy2*cos - dy1*sin cancels in the second half of dx
    (dx,) = torch.autograd.grad(y, x, dy)
    second = dx[..., D // 2:]
    _check_zero_first_half(torch.cat([second, second], dim=-1), f"{backend} rope backward")


@pytest.mark.gpu
def test_negative_control_default_fusion_leaves_residues(monkeypatch):
    """The same Triton kernel with Triton's default (fusion on) must fail the check above."""
    from rl_engine.ops.rope import triton as rope_triton

    x, cos, sin = _cancelling_inputs(torch.device("cuda"))
    monkeypatch.setattr(rope_triton, "FP_FUSION", True)
    y = rope(x, cos, sin, backend="triton_cuda_bf16")
    with pytest.raises(AssertionError, match="fused multiply-add"):
        _check_zero_first_half(y, "triton rope with enable_fp_fusion=True")
