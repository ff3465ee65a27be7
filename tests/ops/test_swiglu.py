"""Tests of SwiGLU: forward/backward accuracy, invariance with negative controls, bad inputs."""

from __future__ import annotations

import pytest

from _helpers import (assert_one_and_odd_token_counts, bits_equal, case_fixtures, check_backward_accuracy,
                      check_forward_accuracy, check_transform, gradients)
from rl_engine.errors import InputError
from rl_engine.ops.spec import make_generator, randn
from rl_engine.ops.swiglu import swiglu
from rl_engine.ops.swiglu.spec import SPEC

SEED = 77
cases, grad_case = case_fixtures(SPEC, SEED)


def test_cases_cover_one_and_odd_token_counts(cases):
    assert_one_and_odd_token_counts([c.inputs["gate"].shape[0] for c in cases])


def test_forward_accuracy(cases, contract):
    for case in cases:
        check_forward_accuracy(SPEC, case, contract)


def test_backward_accuracy(grad_case, contract):
    res = check_backward_accuracy(SPEC, grad_case, contract)
    g2 = gradients(SPEC.impls["triton_cuda_bf16"], grad_case.inputs, SPEC.grad_inputs, res.upstream)
    assert all(bits_equal(res.grads[n], g2[n]) for n in SPEC.grad_inputs)


@pytest.mark.parametrize("direction", ["forward", "gradient"])
@pytest.mark.parametrize("name", ["batch", "chunk", "padding", "layout", "tp"])
def test_invariance_and_negative_control(name, direction, cases, grad_case):
    check_transform(SPEC, name, cases[2] if direction == "forward" else grad_case, direction)


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
