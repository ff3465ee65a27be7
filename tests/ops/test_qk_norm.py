"""Tests of QK-norm: accuracy, equality with RMSNorm on the [T*H, D] rows, P2 bits through the
QK-norm path, eps without default, invariance (head split included) with negative controls."""

from __future__ import annotations

import inspect

import pytest
import torch

from _helpers import (assert_one_and_odd_token_counts, bits_equal, case_fixtures, check_backward_accuracy,
                      check_forward_accuracy, check_transform)
from rl_engine.errors import InputError
from rl_engine.ops.execute import make_upstream, run_gradient
from rl_engine.ops.qk_norm import qk_norm
from rl_engine.ops.qk_norm import api as qk_api
from rl_engine.ops.qk_norm.spec import SPEC
from rl_engine.ops.rms_norm import rms_norm
from rl_engine.ops.rms_norm.spec import norm_weight
from rl_engine.ops.spec import make_generator, randn

SEED = 99
P2_BITS = {"hf": (0x3F92, 0x4012), "fused": (0x3F91, 0x4011)}
cases, grad_case = case_fixtures(SPEC, SEED)


def test_cases_cover_shapes_and_orders(cases):
    assert_one_and_odd_token_counts([c.inputs["x"].shape[0] for c in cases])
    assert {c.inputs["order"] for c in cases} == {"hf", "fused"}


def test_forward_accuracy(cases, contract):
    for case in cases:
        check_forward_accuracy(SPEC, case, contract)


def test_backward_accuracy(grad_case, contract):
    check_backward_accuracy(SPEC, grad_case, contract, relative=True)


@pytest.mark.parametrize("order", ["hf", "fused"])
def test_equals_rms_norm_on_rows(order, grad_case):
    """QK-norm is RMSNorm on the [T*H, D] view: forward, dx and dweight bit for bit."""
    x, w, eps = grad_case.inputs["x"], grad_case.inputs["weight"], grad_case.inputs["eps"]
    t, h, d = x.shape
    up = make_upstream((x,), grad_case.seed + 7)
    qk_inputs = {"x": x, "weight": w, "eps": eps, "order": order}
    rms_inputs = {"x": x.reshape(t * h, d), "weight": w, "eps": eps, "order": order}
    outs_q, g_q, _ = run_gradient(SPEC.impls["triton_cuda_bf16"], qk_inputs, ("x", "weight"), upstream=up)
    outs_r, g_r, _ = run_gradient(lambda **kw: rms_norm(**kw), rms_inputs, ("x", "weight"),
                                  upstream=(up[0].reshape(t * h, d),))
    assert bits_equal(outs_q[0].reshape(t * h, d), outs_r[0])
    assert bits_equal(g_q["x"].reshape(t * h, d), g_r["x"])
    assert bits_equal(g_q["weight"], g_r["weight"])


@pytest.mark.parametrize("direction", ["forward", "gradient"])
@pytest.mark.parametrize("name", ["batch", "chunk", "padding", "layout", "tp"])
def test_invariance_and_negative_control(name, direction, cases, grad_case):
    check_transform(SPEC, name, cases[2] if direction == "forward" else grad_case, direction)


@pytest.mark.parametrize("t", [1, 3])
@pytest.mark.parametrize("backend", ["triton_cuda_bf16", "torch_bf16"])
@pytest.mark.parametrize("order", ["hf", "fused"])
def test_p2_rounding_order_bits_qk_path(order, backend, t, device):
    x = torch.tensor([1.0, 1.0, 1.0, 2.0] * 32, dtype=torch.bfloat16, device=device).repeat(t, 3, 1)
    w = torch.full((128,), 1.5, dtype=torch.bfloat16, device=device)
    y = qk_norm(x, w, 1e-6, order, backend=backend)
    lo, hi = P2_BITS[order]
    expect = torch.tensor([lo, lo, lo, hi] * 32, dtype=torch.int32).to(torch.int16).repeat(t, 3, 1)
    assert torch.equal(y.view(torch.int16).cpu(), expect)


def test_eps_has_no_default(device):
    for fn in (qk_api.qk_norm, *SPEC.impls.values()):
        assert inspect.signature(fn).parameters["eps"].default is inspect.Parameter.empty, fn
    with pytest.raises(TypeError):
        qk_norm(torch.ones((1, 1, 4), dtype=torch.bfloat16, device=device),
                torch.ones(4, dtype=torch.bfloat16, device=device))  # type: ignore[call-arg]


def test_bad_inputs_raise(device):
    g = make_generator(SEED)
    x = randn((3, 2, 8), g, device=device)
    w = norm_weight(8, g, device)
    with pytest.raises(InputError, match="dtype"):
        qk_norm(x.float(), w, 1e-6)
    with pytest.raises(InputError, match="dtype"):
        qk_norm(x, w.half(), 1e-6)
    with pytest.raises(InputError, match="shape"):
        qk_norm(x, norm_weight(4, g, device), 1e-6)
    with pytest.raises(InputError, match="dimensions"):
        qk_norm(x[0], w, 1e-6)
    with pytest.raises(InputError, match="stride"):
        qk_norm(x.transpose(1, 2).contiguous().transpose(1, 2), w, 1e-6)
    with pytest.raises(InputError, match="eps"):
        qk_norm(x, w, None)
    with pytest.raises(InputError, match="order"):
        qk_norm(x, w, 1e-6, "round_once")
