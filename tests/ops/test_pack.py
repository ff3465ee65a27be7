"""Tests of pack / unpack: exact copies both ways, backward = the other op, invariance, bad inputs."""

from __future__ import annotations

import pytest
import torch

from rl_engine.errors import InputError
from rl_engine.ops.execute import make_upstream, run_forward, run_gradient, upcast_inputs
from rl_engine.ops.pack import pack, unpack
from rl_engine.ops.pack.spec import SPEC, cu_from_lengths
from rl_engine.ops.spec import WORKLOADS, make_generator, randn

SMOKE = WORKLOADS["smoke"]
SEED = 31
_INT = {torch.bfloat16: torch.int16, torch.float32: torch.int32}
BACKENDS = ("reference_fp32", "torch_bf16", "triton_cuda_bf16")


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


def test_cases_cover_shapes(cases):
    totals = [int(c.inputs["cu_seqlens"][-1]) for c in cases]
    assert 1 in totals and any(t % 2 for t in totals if t > 1)
    assert any(0 in (c.inputs["cu_seqlens"][1:] - c.inputs["cu_seqlens"][:-1]).tolist() for c in cases)


def test_forward_exact(cases, contract):
    tol = contract.tolerance("forward", contract.op_class("pack"))
    for case in cases:
        (out,) = run_forward(SPEC.impls["triton_cuda_bf16"], case.inputs)
        (ref,) = run_forward(SPEC.impls["reference_fp32"], upcast_inputs(case.inputs))
        (hf,) = run_forward(SPEC.impls["torch_bf16"], case.inputs)
        assert out.dtype == torch.bfloat16 and out.shape == ref.shape, case.id
        torch.testing.assert_close(out.float(), ref, atol=tol.atol, rtol=tol.rtol, msg=case.id)
        assert torch.equal(out.float(), ref), f"{case.id}: not an exact copy"
        assert _bits_equal(out, hf), case.id


def test_backward_is_unpack(grad_case, contract):
    tol = contract.tolerance("gradient", contract.op_class("pack"))
    impl = SPEC.impls["triton_cuda_bf16"]
    up = make_upstream(run_forward(impl, grad_case.inputs), grad_case.seed + 7)
    _, g, _ = run_gradient(impl, grad_case.inputs, SPEC.grad_inputs, upstream=up)
    _, g_ref, _ = run_gradient(SPEC.impls["reference_fp32"], upcast_inputs(grad_case.inputs),
                               SPEC.grad_inputs, upstream=tuple(u.float() for u in up))
    dx = g["x"]
    assert dx.dtype == torch.bfloat16 and dx.shape == grad_case.inputs["x"].shape
    torch.testing.assert_close(dx.float(), g_ref["x"], atol=tol.atol, rtol=tol.rtol)
    assert torch.equal(dx.float(), g_ref["x"])
    s = grad_case.inputs["x"].shape[1]
    assert _bits_equal(dx, unpack(up[0], grad_case.inputs["cu_seqlens"], s))


@pytest.mark.parametrize("backend", BACKENDS)
def test_unpack_exact_and_zero_padding(backend, grad_case):
    x, cu = grad_case.inputs["x"], grad_case.inputs["cu_seqlens"]
    b, s, e = x.shape
    packed = pack(x, cu)
    src = packed.float() if backend == "reference_fp32" else packed
    out = unpack(src, cu, s, backend=backend)
    lengths = (cu[1:] - cu[:-1]).tolist()
    expect = torch.zeros_like(x)
    for i, n in enumerate(lengths):
        expect[i, :n] = x[i, :n]
    assert out.shape == (b, s, e)
    assert _bits_equal(out.to(torch.bfloat16), expect)
    assert _bits_equal(pack(out.to(torch.bfloat16), cu), packed)


def test_unpack_backward_is_pack(grad_case):
    x, cu = grad_case.inputs["x"], grad_case.inputs["cu_seqlens"]
    packed = pack(x, cu).detach().requires_grad_(True)
    out = unpack(packed, cu, x.shape[1])
    dy = randn(tuple(out.shape), make_generator(SEED + 1), device=x.device)
    out.backward(dy)
    assert _bits_equal(packed.grad, pack(dy, cu))


@pytest.mark.parametrize("direction", ["forward", "gradient"])
@pytest.mark.parametrize("name", ["batch", "chunk", "padding", "layout"])
def test_invariance_and_negative_control(name, direction, grad_case):
    fn = SPEC.transform(name)
    assert callable(fn)
    impl = SPEC.impls["triton_cuda_bf16"]
    pairs = fn(impl, grad_case, direction, False)
    assert pairs
    for p in pairs:
        assert _bits_equal(p.canonical, p.transformed), f"{name}/{direction}: {p.label}"
    planted = fn(impl, grad_case, direction, True)
    assert any(not _bits_equal(p.canonical, p.transformed) for p in planted), f"{name}: control passed"


def test_tp_is_declared_na():
    assert isinstance(SPEC.transform("tp"), str)


def test_empty_batch_and_empty_sequences(device):
    x = randn((0, 4, 8), make_generator(SEED), device=device)
    out = pack(x, torch.zeros(1, dtype=torch.int32, device=device))
    assert out.shape == (0, 8) and out.dtype == torch.bfloat16
    x = randn((2, 4, 8), make_generator(SEED), device=device)
    out = pack(x, cu_from_lengths([0, 0], device))
    assert out.shape == (0, 8)
    back = unpack(out, cu_from_lengths([0, 0], device), 4)
    assert _bits_equal(back, torch.zeros_like(x))


def test_bad_inputs_raise(device):
    x = randn((2, 5, 8), make_generator(SEED), device=device)
    cu = cu_from_lengths([3, 5], device)
    with pytest.raises(InputError, match="dtype"):
        pack(x.float(), cu)
    with pytest.raises(InputError, match="dtype"):
        pack(x, cu.long())
    with pytest.raises(InputError, match="dimensions"):
        pack(x[0], cu)
    with pytest.raises(InputError, match="B\\+1"):
        pack(x, cu[:2])
    with pytest.raises(InputError, match="start at 0"):
        pack(x, torch.tensor([1, 3, 5], dtype=torch.int32, device=device))
    with pytest.raises(InputError, match="non-decreasing"):
        pack(x, torch.tensor([0, 4, 3], dtype=torch.int32, device=device))
    with pytest.raises(InputError, match="> S"):
        pack(x, cu_from_lengths([6, 1], device))
    with pytest.raises(InputError, match="stride"):
        pack(x.transpose(1, 2).contiguous().transpose(1, 2), cu)
    packed = pack(x, cu)
    with pytest.raises(InputError, match="does not match"):
        unpack(packed[:7], cu, 5)
    with pytest.raises(InputError, match="> S"):
        unpack(packed, cu, 4)
    with pytest.raises(InputError, match="S:"):
        unpack(packed, cu, -1)
    with pytest.raises(InputError, match="dtype"):
        unpack(packed.float(), cu, 5)
