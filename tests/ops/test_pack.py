"""Tests of pack / unpack: exact copies both ways, backward = the other op, invariance, bad inputs."""

from __future__ import annotations

import pytest
import torch

from _helpers import (assert_one_and_odd_token_counts, bits_equal, case_fixtures, check_backward_accuracy,
                      check_forward_accuracy, check_transform)
from rl_engine.errors import InputError
from rl_engine.ops.execute import run_forward
from rl_engine.ops.pack import pack, unpack
from rl_engine.ops.pack.spec import SPEC, cu_from_lengths
from rl_engine.ops.spec import make_generator, randn

SEED = 31
BACKENDS = ("reference_fp32", "torch_bf16", "triton_cuda_bf16")
cases, grad_case = case_fixtures(SPEC, SEED)


def test_cases_cover_shapes(cases):
    assert_one_and_odd_token_counts([int(c.inputs["cu_seqlens"][-1]) for c in cases])
    assert any(0 in (c.inputs["cu_seqlens"][1:] - c.inputs["cu_seqlens"][:-1]).tolist() for c in cases)


def test_forward_exact(cases, contract):
    for case in cases:
        res = check_forward_accuracy(SPEC, case, contract, relative=False)
        (hf,) = run_forward(SPEC.impls["torch_bf16"], case.inputs)
        assert torch.equal(res.out.float(), res.ref), f"{case.id}: not an exact copy"
        assert bits_equal(res.out, hf), case.id


def test_backward_is_unpack(grad_case, contract):
    res = check_backward_accuracy(SPEC, grad_case, contract)
    dx = res.grads["x"]
    assert torch.equal(dx.float(), res.ref["x"])
    s = grad_case.inputs["x"].shape[1]
    assert bits_equal(dx, unpack(res.upstream[0], grad_case.inputs["cu_seqlens"], s))


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
    assert bits_equal(out.to(torch.bfloat16), expect)
    assert bits_equal(pack(out.to(torch.bfloat16), cu), packed)


def test_unpack_backward_is_pack(grad_case):
    x, cu = grad_case.inputs["x"], grad_case.inputs["cu_seqlens"]
    packed = pack(x, cu).detach().requires_grad_(True)
    out = unpack(packed, cu, x.shape[1])
    dy = randn(tuple(out.shape), make_generator(SEED + 1), device=x.device)
    out.backward(dy)
    assert bits_equal(packed.grad, pack(dy, cu))


@pytest.mark.parametrize("direction", ["forward", "gradient"])
@pytest.mark.parametrize("name", ["batch", "chunk", "padding", "layout"])
def test_invariance_and_negative_control(name, direction, grad_case):
    check_transform(SPEC, name, grad_case, direction)


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
    assert bits_equal(back, torch.zeros_like(x))


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
