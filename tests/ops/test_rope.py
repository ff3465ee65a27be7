"""Tests of RoPE: FP32 cos/sin tables (pitfall P3), forward/backward accuracy, invariance."""

from __future__ import annotations

import pytest
import torch

from rl_engine.errors import InputError
from rl_engine.ops.execute import make_upstream, run_forward, run_gradient, upcast_inputs
from rl_engine.ops.rope import cos_sin, inv_freq, rope
from rl_engine.ops.rope.spec import SPEC
from rl_engine.ops.spec import WORKLOADS, make_generator, randn

SMOKE = WORKLOADS["smoke"]
SEED = 2024
_INT = {torch.bfloat16: torch.int16, torch.float32: torch.int32}
P3_POSITIONS = [0, 1, 255, 256, 257, 4095, 15962, 32767, 40959]


def _bits_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.dtype in _INT:
        return torch.equal(a.contiguous().view(_INT[a.dtype]), b.contiguous().view(_INT[b.dtype]))
    return torch.equal(a, b)


@pytest.fixture(scope="module")
def cases(device):
    return SPEC.build_cases(SMOKE, SEED, device)


@pytest.fixture(scope="module")
def grad_case(device):
    return SPEC.build_grad_cases(SMOKE, SEED, device)[0]


def test_cases_cover_shapes_and_position_kinds(cases):
    counts = [c.inputs["x"].shape[0] for c in cases]
    assert 1 in counts and any(t % 2 for t in counts if t > 1)
    assert any("restart" in c.id for c in cases) and any("arbitrary" in c.id for c in cases)


def test_forward_accuracy(cases, contract):
    cls = contract.op_class("rope")
    tol = contract.tolerance("forward", cls)
    k = contract.relative_factor("forward")
    for case in cases:
        (out,) = run_forward(SPEC.impls["triton_cuda_bf16"], case.inputs)
        (ref,) = run_forward(SPEC.impls["reference_fp32"], upcast_inputs(case.inputs))
        (hf,) = run_forward(SPEC.impls["torch_bf16"], case.inputs)
        assert out.dtype == torch.bfloat16 and out.shape == case.inputs["x"].shape
        torch.testing.assert_close(out.float(), ref, atol=tol.atol, rtol=tol.rtol, msg=case.id)
        err, err_hf = (out.float() - ref).abs().max(), (hf.float() - ref).abs().max()
        assert err <= k * err_hf, f"{case.id}: {err} > {k} x {err_hf}"


def test_backward_accuracy(grad_case, contract):
    tol = contract.tolerance("gradient", contract.op_class("rope"))
    impl = SPEC.impls["triton_cuda_bf16"]
    up = make_upstream(run_forward(impl, grad_case.inputs), grad_case.seed + 7)
    _, g, _ = run_gradient(impl, grad_case.inputs, SPEC.grad_inputs, upstream=up)
    _, g_ref, _ = run_gradient(SPEC.impls["reference_fp32"], upcast_inputs(grad_case.inputs),
                               SPEC.grad_inputs, upstream=tuple(u.float() for u in up))
    assert g["x"].dtype == torch.bfloat16
    torch.testing.assert_close(g["x"].float(), g_ref["x"], atol=tol.atol, rtol=tol.rtol)
    _, g2, _ = run_gradient(impl, grad_case.inputs, SPEC.grad_inputs, upstream=up)
    assert _bits_equal(g["x"], g2["x"])


@pytest.mark.parametrize("direction", ["forward", "gradient"])
@pytest.mark.parametrize("name", ["batch", "chunk", "padding", "layout", "tp"])
def test_invariance_and_negative_control(name, direction, cases, grad_case):
    fn = SPEC.transform(name)
    assert callable(fn)
    case = cases[2] if direction == "forward" else grad_case
    impl = SPEC.impls["triton_cuda_bf16"]
    pairs = fn(impl, case, direction, False)
    assert pairs
    for p in pairs:
        assert _bits_equal(p.canonical, p.transformed), f"{name}/{direction}: {p.label}"
    planted = fn(impl, case, direction, True)
    assert any(not _bits_equal(p.canonical, p.transformed) for p in planted), f"{name}: control passed"


def test_packed_restart_case_invariance(cases):
    case = next(c for c in cases if "restart" in c.id)
    pairs = SPEC.transforms["batch"](SPEC.impls["triton_cuda_bf16"], case, "forward", False)
    assert all(_bits_equal(p.canonical, p.transformed) for p in pairs)


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
