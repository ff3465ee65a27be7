"""batch_invariant_logp: accuracy vs the FP32 reference, bitwise equality with logp per row,
invariance over the [B, S] layout with negative controls, masked rows, bad inputs, pitfalls P4, P11."""

from __future__ import annotations

import math

import pytest
import torch

from _helpers import SMOKE, bits_equal, check_backward_accuracy, check_forward_accuracy, check_transform
from rl_engine.errors import InputError
from rl_engine.ops.batch_invariant_logp import batch_invariant_logp
from rl_engine.ops.batch_invariant_logp.spec import SPEC
from rl_engine.ops.batch_invariant_logp.api import batch_invariant_logp_triton
from rl_engine.ops.logp.api import logp_triton

P4_VOCAB = 151936


def _cases(device):
    return SPEC.build_cases(SMOKE, 0, device)


def _grad_cases(device):
    return SPEC.build_grad_cases(SMOKE, 100, device)


CASE_IDS = ["B4-S20-V1000-right", "B3-S7-V1000-left", "B1-S1-V1000-right", "B3-S7-V1000-left-temp0.7"]


def _case(case_id, device):
    return next(c for c in _cases(device) if c.id == case_id)


def test_case_ids(device):
    assert [c.id for c in _cases(device)] == CASE_IDS
    assert [c.id for c in _grad_cases(device)] == ["B4-S20-V1000-right", "B3-S7-V1000-left-temp0.7"]
    assert set(SPEC.impls) == {"reference_fp32", "torch_bf16", "triton_cuda_bf16", "cuda_bf16"}
    assert isinstance(SPEC.transforms["tp"], str)


@pytest.mark.parametrize("case_id", CASE_IDS)
def test_forward_matches_reference_and_logp(device, contract, case_id):
    case = _case(case_id, device)
    res = check_forward_accuracy(SPEC, case, contract, out_dtype=torch.float32, tier="float32")
    out = res.out
    assert res.base.dtype == torch.float32
    # Masked positions are exactly +0; unmasked rows are bitwise logp's rows.
    m = case.inputs["mask"]
    assert bits_equal(out[~m], torch.zeros_like(out[~m]))
    x, t = case.inputs["logits"], case.inputs["targets"]
    assert bits_equal(out[m], logp_triton(x[m], t[m], case.inputs["temperature"]))


@pytest.mark.parametrize("idx", [0, 1])
def test_backward_matches_reference(device, contract, idx):
    case = _grad_cases(device)[idx]
    res = check_backward_accuracy(SPEC, case, contract, grad_dtype=torch.float32, tier="float32")
    d, up = res.grads["logits"], res.upstream
    m = case.inputs["mask"]
    assert bits_equal(d[~m], torch.zeros_like(d[~m]))
    # rows equal logp's gradient rows bitwise
    x, t = case.inputs["logits"], case.inputs["targets"]
    leaf = x[m].clone().requires_grad_(True)
    logp_triton(leaf, t[m], case.inputs["temperature"]).backward(up[0][m])
    assert bits_equal(d[m], leaf.grad)


def test_masked_rows_are_never_read(device):
    case = _case("B4-S20-V1000-right", device)
    m = case.inputs["mask"]
    junk = case.inputs["logits"].clone()
    junk[~m] = float("nan")
    t = case.inputs["targets"].clone()
    t[~m] = 10**9  # out of range, but masked: neither validated nor used
    out = batch_invariant_logp_triton(junk, t, m)
    assert bits_equal(out, batch_invariant_logp_triton(case.inputs["logits"], case.inputs["targets"], m))


def test_empty_and_all_masked(device):
    x = torch.randn(2, 3, 5, device=device)
    t = torch.full((2, 3), -1, dtype=torch.int64, device=device)
    m = torch.zeros((2, 3), dtype=torch.bool, device=device)
    out = batch_invariant_logp_triton(x, t, m)
    assert bits_equal(out, torch.zeros((2, 3), device=device))
    e = batch_invariant_logp_triton(torch.zeros((0, 4, 5), device=device),
                                    torch.zeros((0, 4), dtype=torch.int64, device=device),
                                    torch.zeros((0, 4), dtype=torch.bool, device=device))
    assert e.shape == (0, 4) and e.dtype == torch.float32


def test_api_dispatch(device):
    case = _case("B3-S7-V1000-left", device)
    x, t, m = case.inputs["logits"], case.inputs["targets"], case.inputs["mask"]
    assert bits_equal(batch_invariant_logp(x, t, m), batch_invariant_logp_triton(x, t, m))


# -- invariance -------------------------------------------------------------------------------------


@pytest.mark.parametrize("direction", ["forward", "gradient"])
@pytest.mark.parametrize("name", ["batch", "chunk", "padding", "layout"])
def test_invariance_bitwise_and_negative_control(device, name, direction):
    case = _case("B4-S20-V1000-right", device) if direction == "forward" else _grad_cases(device)[1]
    check_transform(SPEC, name, case, direction)


# -- bad inputs -------------------------------------------------------------------------------------


def _bad_inputs(device):
    x = torch.randn(2, 3, 10, device=device)
    t = torch.zeros((2, 3), dtype=torch.int64, device=device)
    m = torch.ones((2, 3), dtype=torch.bool, device=device)
    t_bad = t.clone()
    t_bad[1, 2] = 10
    t_neg = t.clone()
    t_neg[0, 1] = -100
    return [
        (dict(logits=x.bfloat16(), targets=t, mask=m), "dtype"),
        (dict(logits=x[0], targets=t, mask=m), "dimensions"),
        (dict(logits=x, targets=t.int(), mask=m), "dtype"),
        (dict(logits=x, targets=t, mask=m.int()), "dtype"),
        (dict(logits=x, targets=t[:, :2], mask=m), "shape"),
        (dict(logits=x, targets=t, mask=m[:1]), "shape"),
        (dict(logits=x, targets=t_bad, mask=m), r"\[1, 2\]"),
        (dict(logits=x, targets=t_neg, mask=m), r"\[0, 1\]"),
        (dict(logits=x.transpose(1, 2).contiguous().transpose(1, 2), targets=t, mask=m), "stride"),
        (dict(logits=x, targets=t, mask=m, temperature=0.0), "temperature"),
        (dict(logits=x, targets=t, mask=m, temperature=float("nan")), "temperature"),
    ]


@pytest.mark.parametrize("idx", range(11))
def test_bad_inputs_raise(device, idx):
    kwargs, word = _bad_inputs(device)[idx]
    with pytest.raises(InputError, match=word):
        batch_invariant_logp_triton(**kwargs)


# -- pitfalls ---------------------------------------------------------------------------------------


def test_pitfall_p4_vocab_151936(device, contract):
    tol = contract.tolerance("forward", "logprob", "float32")
    x = torch.zeros((2, 3, P4_VOCAB), dtype=torch.float32, device=device)
    x[0, 1, 5] = -20.0
    x[1, 0, P4_VOCAB - 1] = 10.0
    x[0, 2] = float("nan")  # masked
    t = torch.tensor([[0, 5, -100], [P4_VOCAB - 1, -100, -100]], device=device)
    m = torch.tensor([[True, True, False], [True, False, False]], device=device)
    out = batch_invariant_logp_triton(x, t, m)
    expected = torch.tensor([[-11.931215, -31.931208, 0.0], [-2.0665891, 0.0, 0.0]], device=device)
    torch.testing.assert_close(out, expected, atol=tol.atol, rtol=tol.rtol)
    assert float(out[0, 0]) == pytest.approx(-math.log(P4_VOCAB), abs=tol.atol)


@pytest.mark.parametrize("temperature, expected", [(0.6, -0.0350524), (1.0, -0.1269280)])
def test_pitfall_p11_temperature(device, contract, temperature, expected):
    tol = contract.tolerance("forward", "logprob", "float32")
    x = torch.tensor([[[2.0, 0.0], [5.0, 5.0]]], device=device)
    t = torch.tensor([[0, 1]], device=device)
    m = torch.tensor([[True, False]], device=device)
    out = batch_invariant_logp_triton(x, t, m, temperature)
    torch.testing.assert_close(out, torch.tensor([[expected, 0.0]], device=device), atol=tol.atol, rtol=tol.rtol)
