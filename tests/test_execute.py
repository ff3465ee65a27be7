"""run_gradient protects the caller's upstream gradient from implementations that write it in place."""

from __future__ import annotations

import torch

from rl_engine.ops.execute import run_gradient


class _DoubleInPlace(torch.autograd.Function):
    """y = 2x whose backward doubles dy where it lies (as Liger's RoPE backward rotates it)."""

    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, dy):
        return dy.mul_(2)


def _impl(x):
    return _DoubleInPlace.apply(x)


def test_in_place_backward_cannot_corrupt_the_shared_upstream():
    x = torch.randn(4, 3, dtype=torch.bfloat16)
    up = torch.randn(4, 3, dtype=torch.bfloat16)
    before = up.clone()
    _, g1, _ = run_gradient(_impl, {"x": x}, ("x",), upstream=(up,))
    _, g2, _ = run_gradient(_impl, {"x": x}, ("x",), upstream=(up,))
    assert torch.equal(up.view(torch.int16), before.view(torch.int16))
    assert torch.equal(g1["x"].view(torch.int16), g2["x"].view(torch.int16))


def test_control_the_impl_really_writes_its_input_gradient():
    x = torch.randn(4, 3, dtype=torch.bfloat16, requires_grad=True)
    up = torch.randn(4, 3, dtype=torch.bfloat16)
    before = up.clone()
    torch.autograd.backward(_impl(x), up)
    assert not torch.equal(up.view(torch.int16), before.view(torch.int16))
