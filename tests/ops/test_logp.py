"""logp: accuracy vs the FP32 reference, invariance (bitwise) with negative controls, bad inputs,
pitfalls P4, P5 (unfused path) and P11."""

from __future__ import annotations

import math

import pytest
import torch

from _helpers import (SMOKE, assert_within, bits_equal, check_backward_accuracy, check_forward_accuracy,
                      check_transform, control_caught, differing)
from rl_engine.errors import InputError
from rl_engine.ops.execute import make_upstream, run_forward, run_gradient
from rl_engine.ops.logp import logp
from rl_engine.ops.logp.spec import SPEC
from rl_engine.ops.logp.api import logp_triton, logp_triton_size_dependent
from rl_engine.ops.transforms import _row_subsets
from rl_engine.ops.spec import WORKLOADS

P4_VOCAB = 151936


def _cases(device):
    return SPEC.build_cases(SMOKE, 0, device)


def _grad_cases(device):
    return SPEC.build_grad_cases(SMOKE, 100, device)


def _case(cases, case_id):
    return next(c for c in cases if c.id == case_id)


# -- accuracy ---------------------------------------------------------------------------------------


def test_case_ids_and_shapes(device):
    ids = [c.id for c in _cases(device)]
    assert ids == ["T1-V1000", "T7-V1000", "T33-V1000", "T7-V1000-temp0.7"]
    from rl_engine.ops.logp.spec import token_counts

    # qwen3-8b cases are 151936-wide FP32 rows: built by the gate on the GPU, not here.
    assert token_counts(WORKLOADS["qwen3-8b"]) == (1, 257, 1027)
    assert set(SPEC.impls) == {"reference_fp32", "torch_bf16", "triton_cuda_bf16", "cuda_bf16"}
    assert isinstance(SPEC.transforms["tp"], str)


@pytest.mark.parametrize("case_id", ["T1-V1000", "T7-V1000", "T33-V1000", "T7-V1000-temp0.7"])
def test_forward_matches_reference(device, contract, case_id):
    case = _case(_cases(device), case_id)
    # Relative criterion: no worse than factor x the naive BF16 path (which is far worse).
    res = check_forward_accuracy(SPEC, case, contract, out_dtype=torch.float32, tier="float32")
    assert res.base.dtype == torch.float32
    assert res.err < res.err_base


@pytest.mark.parametrize("idx", [0, 1])
def test_backward_matches_reference(device, contract, idx):
    check_backward_accuracy(SPEC, _grad_cases(device)[idx], contract, grad_dtype=torch.float32, tier="float32")


def test_deterministic(device):
    case = _case(_cases(device), "T33-V1000")
    a = run_forward(logp_triton, case.inputs)[0]
    b = run_forward(logp_triton, case.inputs)[0]
    assert bits_equal(a, b)
    gc = _grad_cases(device)[0]
    up = make_upstream(run_forward(logp_triton, gc.inputs), 3)
    g1 = run_gradient(logp_triton, gc.inputs, ("logits",), upstream=up)[1]["logits"]
    g2 = run_gradient(logp_triton, gc.inputs, ("logits",), upstream=up)[1]["logits"]
    assert bits_equal(g1, g2)


@pytest.mark.parametrize("v", [1000, 1001])
def test_rows_bitwise_under_any_stride_and_base_alignment(device, v):
    """Views whose row stride (V + 8, V + 5) and base offset (0, 3 elements) give different
    alignments score every row bitwise like the contiguous tensor: the kernel's reduction order
    must not follow the alignment the compiler can prove."""
    g = torch.Generator().manual_seed(v)
    x = (torch.randn((6, v), generator=g) * 3.0).to(device)
    t = torch.randint(0, v, (6,), generator=g).to(device)
    canonical = logp_triton(x, t)
    for pad, shift in ((8, 0), (5, 3), (16, 1)):
        wide = torch.full((6, v + pad), float("nan"), device=device)
        wide[:, shift:shift + v] = x
        assert bits_equal(logp_triton(wide[:, shift:shift + v], t), canonical), (pad, shift)
    for r in range(6):
        assert bits_equal(logp_triton(x[r:], t[r:])[:1], canonical[r:r + 1]), r


def test_empty_rows(device):
    out = logp_triton(torch.zeros((0, 10), device=device), torch.zeros((0,), dtype=torch.int64, device=device))
    assert out.shape == (0,) and out.dtype == torch.float32


def test_neg_inf_logits_contribute_nothing(device):
    x = torch.tensor([[0.0, float("-inf"), 0.0, float("-inf")], [float("-inf")] * 3 + [1.5]], device=device)
    t = torch.tensor([2, 3], device=device)
    out = logp_triton(x, t)
    # exp(-inf - m) is exactly 0: the rows are log(1/2) and log(1) = 0, computed in FP32
    assert bits_equal(out, torch.tensor([-math.log(2.0), 0.0], dtype=torch.float32, device=device))


def test_api_dispatch(device, contract):
    case = _case(_cases(device), "T7-V1000")
    x, t = case.inputs["logits"], case.inputs["targets"]
    assert bits_equal(logp(x, t), logp_triton(x, t))
    assert_within(logp(x, t, backend="reference_fp32"), logp_triton(x, t),
                  contract.tolerance("forward", "logprob", "float32"))


# -- invariance -------------------------------------------------------------------------------------


@pytest.mark.parametrize("direction", ["forward", "gradient"])
@pytest.mark.parametrize("name", ["batch", "chunk", "padding", "layout"])
def test_invariance_bitwise_and_negative_control(device, name, direction):
    case = _case(_cases(device), "T33-V1000") if direction == "forward" else _grad_cases(device)[1]
    check_transform(SPEC, name, case, direction)


def test_size_dependent_control_is_caught(device):
    """The T-dependent V tile changes the sum-exp grouping. The forward logprob often absorbs the
    change in its final rounding (its magnitude is ~10, log(s) moves by ~1e-7), so the check is
    caught exactly when the control really changes the bits of a row the transform visits; the
    control's tile rule regroups every visited subset, so the gate's case (T = the gradient token
    count) has enough changed rows to catch it."""
    assert SPEC.controls["batch"] is logp_triton_size_dependent
    fn = SPEC.transforms["batch"]
    case = _case(_cases(device), "T33-V1000")
    x, t = case.inputs["logits"], case.inputs["targets"]
    full = logp_triton_size_dependent(x, t)
    changed = False
    for _, rows in _row_subsets(x.shape[0]):  # the subsets the batch transform scores
        idx = torch.tensor(rows, device=x.device)
        changed |= not bits_equal(logp_triton_size_dependent(x[idx], t[idx]), full[idx])
    pairs = fn(logp_triton_size_dependent, case, "forward", False)
    caught = any(not bits_equal(p.canonical, p.transformed) for p in pairs)
    assert caught == changed
    # the gate's own cell (forward, on the op's invariance case = first gradient case) catches it
    gcase = _grad_cases(device)[0]
    assert control_caught(fn(logp_triton_size_dependent, gcase, "forward", False)), "size-dependent tile not caught"
    # and the real kernel passes the same checks
    assert not differing(fn(logp_triton, gcase, "forward", False))
    assert not differing(fn(logp_triton, gcase, "gradient", False))


# -- bad inputs -------------------------------------------------------------------------------------


def _bad_inputs(device):
    x = torch.randn(4, 10, device=device)
    t = torch.tensor([0, 1, 2, 9], device=device)
    return [
        ("bf16 logits", dict(logits=x.bfloat16(), targets=t), "dtype"),
        ("1-D logits", dict(logits=x[0], targets=t), "dimensions"),
        ("int32 targets", dict(logits=x, targets=t.int()), "dtype"),
        ("targets length", dict(logits=x, targets=t[:3]), "shape"),
        ("target = V", dict(logits=x, targets=torch.tensor([0, 1, 2, 10], device=device)), "outside"),
        ("target = -1", dict(logits=x, targets=torch.tensor([0, -1, 2, 3], device=device)), "outside"),
        ("strided V", dict(logits=x.t().contiguous().t(), targets=t), "stride"),
        ("empty V", dict(logits=torch.zeros(4, 0, device=device), targets=t), "empty"),
        ("temperature 0", dict(logits=x, targets=t, temperature=0.0), "temperature"),
        ("temperature < 0", dict(logits=x, targets=t, temperature=-1.0), "temperature"),
        ("temperature nan", dict(logits=x, targets=t, temperature=float("nan")), "temperature"),
        ("temperature inf", dict(logits=x, targets=t, temperature=float("inf")), "temperature"),
        ("temperature tensor", dict(logits=x, targets=t, temperature=torch.tensor(1.0)), "temperature"),
        ("temperature bool", dict(logits=x, targets=t, temperature=True), "temperature"),
        ("logits not a tensor", dict(logits=x.tolist(), targets=t), "Tensor"),
    ]


@pytest.mark.parametrize("idx", range(15))
def test_bad_inputs_raise(device, idx):
    label, kwargs, word = _bad_inputs(device)[idx]
    with pytest.raises(InputError, match=word):
        logp_triton(**kwargs)


# -- pitfalls ---------------------------------------------------------------------------------------


def test_pitfall_p4_vocab_151936(device, contract):
    tol = contract.tolerance("forward", "logprob", "float32")
    x = torch.zeros((3, P4_VOCAB), dtype=torch.float32, device=device)
    x[1, 5] = -20.0
    x[2, P4_VOCAB - 1] = 10.0  # in the last, partial tile
    t = torch.tensor([P4_VOCAB - 1, 5, P4_VOCAB - 1], device=device)
    out = logp_triton(x, t)
    expected = torch.tensor([-11.931215, -31.931208, -2.0665891], device=device)
    assert_within(out, expected, tol)
    assert float(out[0]) == pytest.approx(-math.log(P4_VOCAB), abs=tol.atol)
    # the BF16 baseline shows what the pitfall is about (BF16 storage of -11.93 is -11.9375)
    base = SPEC.impls["torch_bf16"](logits=x, targets=t)
    assert (base - expected).abs().max().item() > tol.atol


def test_pitfall_p4_references_are_correctly_rounded(device, contract):
    """The FP32 golds themselves at P4's inputs (torch.log_softmax on the CPU was 4.9e-5 off the
    third value); the batched reference too, on the same rows as one [1, 3, V] batch."""
    from rl_engine.ops.batch_invariant_logp.reference import batch_invariant_logp_reference
    from rl_engine.ops.logp.reference import logp_reference

    tol = contract.tolerance("forward", "logprob", "float32")
    x = torch.zeros((3, P4_VOCAB), dtype=torch.float32, device=device)
    x[1, 5] = -20.0
    x[2, P4_VOCAB - 1] = 10.0
    t = torch.tensor([P4_VOCAB - 1, 5, P4_VOCAB - 1], device=device)
    expected = torch.tensor([-11.931215, -31.931208, -2.0665891], device=device)
    assert_within(logp_reference(x, t), expected, tol)
    mask = torch.ones((1, 3), dtype=torch.bool, device=device)
    assert_within(batch_invariant_logp_reference(x[None], t[None], mask)[0], expected, tol)


def test_reference_log_softmax_gradient_is_onehot_minus_softmax(device, contract):
    from rl_engine.ops.logp.reference import logp_reference

    tol = contract.tolerance("forward", "logprob", "float32")
    g = torch.Generator().manual_seed(3)
    x = (torch.randn((4, 50), generator=g) * 3).to(device).requires_grad_(True)
    t = torch.tensor([0, 7, 49, 3], device=device)
    logp_reference(x, t).sum().backward()
    expected = torch.nn.functional.one_hot(t, 50).float() - torch.softmax(x.detach().double(), -1).float()
    assert_within(x.grad, expected, tol)


def test_pitfall_p5_unfused(device, contract):
    """Hidden size 2, h = [1, 1]; LM-head rows A = [40, 40.25], B = [40, 40], the rest 0. FP32
    logits (A = 80.25, B = 80.0) scored by logp give -0.5759394 and -0.8259394 (BF16 logits would
    give -0.6931472 for A)."""
    tol = contract.tolerance("forward", "logprob", "float32")
    a, b = 7, P4_VOCAB - 1
    hidden = torch.ones((2, 2), dtype=torch.bfloat16, device=device)
    weight = torch.zeros((P4_VOCAB, 2), dtype=torch.bfloat16, device=device)
    weight[a] = torch.tensor([40.0, 40.25])
    weight[b] = torch.tensor([40.0, 40.0])
    logits = hidden.float() @ weight.float().T
    out = logp_triton(logits, torch.tensor([a, b], device=device))
    assert_within(out, torch.tensor([-0.5759394, -0.8259394], device=device), tol)


@pytest.mark.parametrize("temperature, expected", [(0.6, -0.0350524), (1.0, -0.1269280)])
def test_pitfall_p11_temperature(device, contract, temperature, expected):
    tol = contract.tolerance("forward", "logprob", "float32")
    x = torch.tensor([[2.0, 0.0]], device=device)
    t = torch.tensor([0], device=device)
    out = logp_triton(x, t, temperature)
    assert_within(out, torch.tensor([expected], device=device), tol)
    assert_within(SPEC.impls["reference_fp32"](logits=x, targets=t, temperature=temperature), out, tol)
