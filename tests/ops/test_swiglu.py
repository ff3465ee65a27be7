"""Tests of SwiGLU: forward/backward accuracy, invariance with negative controls, bad inputs."""

from __future__ import annotations

import pytest
import torch

from rl_engine.errors import InputError
from rl_engine.ops.execute import make_upstream, run_forward, run_gradient, upcast_inputs
from rl_engine.ops.spec import WORKLOADS, make_generator, randn
from rl_engine.ops.swiglu import swiglu
from rl_engine.ops.swiglu.spec import SPEC

SMOKE = WORKLOADS["smoke"]
SEED = 77
_INT = {torch.bfloat16: torch.int16, torch.float32: torch.int32}


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


def test_cases_cover_one_and_odd_token_counts(cases):
    counts = [c.inputs["gate"].shape[0] for c in cases]
    assert 1 in counts and any(t % 2 for t in counts if t > 1)


def test_forward_accuracy(cases, contract):
    tol = contract.tolerance("forward", contract.op_class("swiglu"))
    k = contract.relative_factor("forward")
    for case in cases:
        (out,) = run_forward(SPEC.impls["triton_cuda_bf16"], case.inputs)
        (ref,) = run_forward(SPEC.impls["reference_fp32"], upcast_inputs(case.inputs))
        (hf,) = run_forward(SPEC.impls["torch_bf16"], case.inputs)
        assert out.dtype == torch.bfloat16 and out.shape == ref.shape
        torch.testing.assert_close(out.float(), ref, atol=tol.atol, rtol=tol.rtol, msg=case.id)
        err, err_hf = (out.float() - ref).abs().max(), (hf.float() - ref).abs().max()
        assert err <= k * err_hf, f"{case.id}: {err} > {k} x {err_hf}"


def test_backward_accuracy(grad_case, contract):
    tol = contract.tolerance("gradient", contract.op_class("swiglu"))
    impl = SPEC.impls["triton_cuda_bf16"]
    up = make_upstream(run_forward(impl, grad_case.inputs), grad_case.seed + 7)
    _, g, _ = run_gradient(impl, grad_case.inputs, SPEC.grad_inputs, upstream=up)
    _, g_ref, _ = run_gradient(SPEC.impls["reference_fp32"], upcast_inputs(grad_case.inputs),
                               SPEC.grad_inputs, upstream=tuple(u.float() for u in up))
    for name in SPEC.grad_inputs:
        assert g[name].dtype == torch.bfloat16
        torch.testing.assert_close(g[name].float(), g_ref[name], atol=tol.atol, rtol=tol.rtol, msg=name)
    _, g2, _ = run_gradient(impl, grad_case.inputs, SPEC.grad_inputs, upstream=up)
    assert all(_bits_equal(g[n], g2[n]) for n in SPEC.grad_inputs)


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


def test_bad_inputs_raise(device):
    g = make_generator(SEED)
    gate = randn((3, 8), g, device=device)
    up = randn((3, 8), g, device=device)
    with pytest.raises(InputError, match="dtype"):
        swiglu(gate.float(), up)
    with pytest.raises(InputError, match="dtype"):
        swiglu(gate, up.half())
    with pytest.raises(InputError, match="same shape"):
        swiglu(gate, up[:2])
    with pytest.raises(InputError, match="dimensions"):
        swiglu(gate[0], up[0])
    with pytest.raises(InputError, match="stride"):
        swiglu(gate.t().contiguous().t(), up)
    with pytest.raises(InputError):
        swiglu(gate, None)
