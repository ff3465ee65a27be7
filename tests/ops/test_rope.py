"""Tests of RoPE: FP32 cos/sin tables (pitfall P3), forward/backward accuracy, invariance."""

from __future__ import annotations

import pytest
import torch

from _helpers import (assert_one_and_odd_token_counts, bits_equal, case_fixtures, check_backward_accuracy,
                      check_forward_accuracy, check_transform, differing, gradients)
from rl_engine.errors import InputError
from rl_engine.ops.rope import cos_sin, inv_freq, rope
from rl_engine.ops.rope.spec import SPEC
from rl_engine.ops.spec import make_generator, randn

SEED = 2024
P3_POSITIONS = [0, 1, 255, 256, 257, 4095, 15962, 32767, 40959]
cases, grad_case = case_fixtures(SPEC, SEED)


def test_cases_cover_shapes_and_position_kinds(cases):
    assert_one_and_odd_token_counts([c.inputs["x"].shape[0] for c in cases])
    assert any("restart" in c.id for c in cases) and any("arbitrary" in c.id for c in cases)


def test_forward_accuracy(cases, contract):
    for case in cases:
        res = check_forward_accuracy(SPEC, case, contract)
        assert res.out.shape == case.inputs["x"].shape


def test_backward_accuracy(grad_case, contract):
    res = check_backward_accuracy(SPEC, grad_case, contract)
    g2 = gradients(SPEC.impls["triton_cuda_bf16"], grad_case.inputs, SPEC.grad_inputs, res.upstream)
    assert bits_equal(res.grads["x"], g2["x"])


@pytest.mark.parametrize("direction", ["forward", "gradient"])
@pytest.mark.parametrize("name", ["batch", "chunk", "padding", "layout", "tp"])
def test_invariance_and_negative_control(name, direction, cases, grad_case):
    check_transform(SPEC, name, cases[2] if direction == "forward" else grad_case, direction)


def test_packed_restart_case_invariance(cases):
    case = next(c for c in cases if "restart" in c.id)
    pairs = SPEC.transforms["batch"](SPEC.impls["triton_cuda_bf16"], case, "forward", False)
    assert not differing(pairs)


def test_p3_cos_sin_fp32_angles(contract, device):
    fp32 = contract.tolerance("forward", "elementwise", "float32")
    bf16 = contract.tolerance("forward", "elementwise")
    positions = torch.tensor(P3_POSITIONS, dtype=torch.int64, device=device)
    cos, sin = cos_sin(positions, 1e6, 128)
    assert cos.dtype == sin.dtype == torch.float32 and cos.shape == (9, 64)
    i = P3_POSITIONS.index(15962)
    expect = torch.tensor(-0.908016)
    torch.testing.assert_close(cos[i, 0].cpu(), expect, atol=fp32.atol, rtol=fp32.rtol)
    wrong = torch.tensor(-0.267950)  # cos(bf16(15962)) = cos(15936)
    assert not torch.allclose(cos[i, 0].cpu(), wrong, atol=bf16.atol, rtol=bf16.rtol)
    torch.testing.assert_close(inv_freq(1e6, 128)[1], torch.tensor(0.8058422), atol=fp32.atol, rtol=fp32.rtol)
    j = P3_POSITIONS.index(4095)
    torch.testing.assert_close(cos[j, 1].cpu(), torch.tensor(0.3139), atol=bf16.atol, rtol=bf16.rtol)


def test_p3_kernel_vs_bf16_angles(contract, device):
    tol = contract.tolerance("forward", contract.op_class("rope"))
    positions = torch.tensor(P3_POSITIONS, dtype=torch.int64, device=device)
    cos, sin = cos_sin(positions, 1e6, 128)
    x = randn((9, 2, 128), make_generator(SEED), scale=2.0, device=device)
    ref = SPEC.impls["reference_fp32"](x.float(), cos, sin)
    out = rope(x, cos, sin)
    torch.testing.assert_close(out.float(), ref.to(torch.bfloat16).float(), atol=tol.atol, rtol=tol.rtol)
    torch.testing.assert_close(out.float(), ref, atol=tol.atol, rtol=tol.rtol)
    # The BF16-angle version: bf16 positions times bf16 inv_freq, rounded in BF16.
    angle = positions.to(torch.bfloat16)[:, None] * inv_freq(1e6, 128).to(device).to(torch.bfloat16)[None, :]
    bad = rope(x, torch.cos(angle.float()), torch.sin(angle.float()))
    assert not torch.allclose(bad.float(), ref, atol=tol.atol, rtol=tol.rtol)


def test_bad_inputs_raise(device):
    x = randn((3, 2, 8), make_generator(SEED), device=device)
    cos, sin = cos_sin(torch.arange(3, device=device), 1e6, 8)
    with pytest.raises(InputError, match="dtype"):
        rope(x.float(), cos, sin)
    with pytest.raises(InputError, match="dtype"):
        rope(x, cos.to(torch.bfloat16), sin)
    with pytest.raises(InputError, match="shape"):
        rope(x, cos[:2], sin[:2])
    with pytest.raises(InputError, match="shape"):
        rope(x, torch.cat([cos, cos], 1), sin)
    with pytest.raises(InputError, match="dimensions"):
        rope(x[0], cos, sin)
    with pytest.raises(InputError, match="even"):
        rope(x[..., :7].contiguous(), cos, sin)
    with pytest.raises(InputError, match="stride"):
        rope(x.transpose(1, 2).contiguous().transpose(1, 2), cos, sin)
    with pytest.raises(InputError, match="stride"):
        rope(x, cos.t().contiguous().t(), sin)
    with pytest.raises(InputError, match="dtype"):
        cos_sin(torch.arange(3, dtype=torch.int32), 1e6, 8)
    with pytest.raises(InputError, match="head_dim"):
        cos_sin(torch.arange(3), 1e6, 7)
