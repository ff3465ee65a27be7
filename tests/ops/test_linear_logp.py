"""linear_logp: accuracy vs the FP32 reference (forward, dhidden, dweight, several V chunks and row
blocks), invariance (bitwise) with negative controls, bad inputs, pitfalls P4 and P5 (fused) and P11."""

from __future__ import annotations

import pytest
import torch

from _helpers import (SMOKE, assert_within, bits_equal, check_backward_accuracy, check_forward_accuracy,
                      check_transform)
from rl_engine.errors import InputError
from rl_engine.ops.execute import make_upstream, run_forward, run_gradient, upcast_inputs
from rl_engine.ops.linear_logp import linear_logp
from rl_engine.ops.linear_logp.reference import linear_logp_reference
from rl_engine.ops.linear_logp.spec import SPEC
from rl_engine.ops.linear_logp.api import linear_logp_triton
from rl_engine.ops.linear_logp.triton import BLOCK_M, CHUNK_V
from rl_engine.ops.logp.api import logp_triton
from rl_engine.ops.spec import make_generator

P4_VOCAB = 151936


def _cases(device):
    return SPEC.build_cases(SMOKE, 0, device)


def _grad_cases(device):
    return SPEC.build_grad_cases(SMOKE, 100, device)


CASE_IDS = ["T1-E64-V1000", "T7-E64-V1000", "T33-E64-V1000", "T7-E64-V1000-temp0.7"]


def _random_problem(t, e, v, seed, device, scale=0.3):
    g = make_generator(seed)
    h = torch.randn((t, e), generator=g).to(torch.bfloat16).to(device)
    w = (torch.randn((v, e), generator=g) * scale).to(torch.bfloat16).to(device)
    tg = torch.randint(0, v, (t,), generator=g).to(device)
    return h, w, tg


def _grads(impl, h, w, tg, up, temperature=1.0):
    inputs = {"hidden": h, "weight": w, "targets": tg, "temperature": temperature}
    if impl is linear_logp_reference:
        inputs = upcast_inputs(inputs)
    outs, grads, _ = run_gradient(impl, inputs, ("hidden", "weight"), upstream=(up,))
    return outs[0], grads["hidden"], grads["weight"]


def _check_fused_vs_reference(contract, h, w, tg, up, temperature=1.0):
    """Logprobs, dhidden and dweight of the kernel within the contract's logprob tolerances (FP32
    forward, BF16 gradient) of the FP32 reference; returns the kernel's logprobs."""
    out, dh, dw = _grads(linear_logp_triton, h, w, tg, up, temperature)
    ref, dh_ref, dw_ref = _grads(linear_logp_reference, h, w, tg, up, temperature)
    tol_g = contract.tolerance("gradient", "logprob", "bfloat16")
    assert_within(out, ref, contract.tolerance("forward", "logprob", "float32"), "logprob")
    assert_within(dh.float(), dh_ref, tol_g, "dhidden")
    assert_within(dw.float(), dw_ref, tol_g, "dweight")
    return out


def test_case_ids(device):
    assert [c.id for c in _cases(device)] == CASE_IDS
    assert [c.id for c in _grad_cases(device)] == ["T9-E64-V1000", "T9-E64-V1000-temp0.7"]
    assert set(SPEC.impls) == {"reference_fp32", "torch_bf16", "triton_cuda_bf16", "cuda_bf16"}
    assert isinstance(SPEC.transforms["tp"], str)


# -- accuracy ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("case_id", CASE_IDS)
def test_forward_matches_reference(device, contract, case_id):
    case = next(c for c in _cases(device) if c.id == case_id)
    # FP32 logits from exact BF16 products: the FP32 logprob tolerance holds at E = 64.
    res = check_forward_accuracy(SPEC, case, contract, out_dtype=torch.float32, tier="float32")
    assert res.base.dtype == torch.float32


@pytest.mark.parametrize("idx", [0, 1])
def test_backward_matches_reference(device, contract, idx):
    check_backward_accuracy(SPEC, _grad_cases(device)[idx], contract, relative=True)


def test_several_row_blocks_forward_backward_and_rows_alone(device, contract):
    """T = BLOCK_M + 6 rows: two row blocks, the dweight loop over both; rows in the second block
    scored alone are bitwise the batch's rows."""
    t = BLOCK_M + 6
    h, w, tg = _random_problem(t, 64, SMOKE.vocab, 5, device)
    up = torch.randn(t, generator=make_generator(6)).to(device)
    out = _check_fused_vs_reference(contract, h, w, tg, up)
    for r in (0, BLOCK_M - 1, BLOCK_M, t - 1):
        assert bits_equal(linear_logp_triton(h[r:r + 1], w, tg[r:r + 1]), out[r:r + 1]), r


def test_several_vocab_chunks_forward_backward(device, contract):
    """V = 2 * CHUNK_V + 37: three V chunks (the last one partial), so the forward merges partials and
    dhidden is accumulated in FP32 across chunks; E = 70 is two BLOCK_E chunks, the second partial."""
    v = 2 * CHUNK_V + 37
    h, w, tg = _random_problem(5, 70, v, 7, device)
    tg[0] = v - 1  # a target in the last, partial tile
    up = torch.randn(5, generator=make_generator(8)).to(device)
    out = _check_fused_vs_reference(contract, h, w, tg, up, 0.7)
    # the same logits scored unfused by logp agree within the FP32 logprob tolerance
    logits = h.float() @ w.float().T
    assert_within(out, logp_triton(logits, tg, 0.7), contract.tolerance("forward", "logprob", "float32"), "unfused")


def test_deterministic(device):
    case = _grad_cases(device)[0]
    up = make_upstream(run_forward(linear_logp_triton, case.inputs), 1)
    a = run_gradient(linear_logp_triton, case.inputs, SPEC.grad_inputs, upstream=up)
    b = run_gradient(linear_logp_triton, case.inputs, SPEC.grad_inputs, upstream=up)
    assert bits_equal(a[0][0], b[0][0])
    for name in SPEC.grad_inputs:
        assert bits_equal(a[1][name], b[1][name]), name


def test_only_hidden_needs_grad(device):
    h, w, tg = _random_problem(3, 16, 50, 9, device)
    leaf = h.clone().requires_grad_(True)
    linear_logp_triton(leaf, w, tg).sum().backward()
    assert leaf.grad is not None and leaf.grad.dtype == torch.bfloat16


def test_empty_rows(device):
    h = torch.zeros((0, 8), dtype=torch.bfloat16, device=device)
    w = torch.ones((5, 8), dtype=torch.bfloat16, device=device).requires_grad_(True)
    out = linear_logp_triton(h, w, torch.zeros((0,), dtype=torch.int64, device=device))
    assert out.shape == (0,) and out.dtype == torch.float32
    out.sum().backward()
    assert bits_equal(w.grad, torch.zeros_like(w.grad))


def test_api_dispatch(device):
    case = next(c for c in _cases(device) if c.id == "T7-E64-V1000")
    h, w, tg = case.inputs["hidden"], case.inputs["weight"], case.inputs["targets"]
    assert bits_equal(linear_logp(h, w, tg), linear_logp_triton(h, w, tg))


# -- invariance -------------------------------------------------------------------------------------


@pytest.mark.parametrize("direction", ["forward", "gradient"])
@pytest.mark.parametrize("name", ["batch", "chunk", "padding", "layout"])
def test_invariance_bitwise_and_negative_control(device, name, direction):
    check_transform(SPEC, name, _grad_cases(device)[0], direction)


# -- bad inputs -------------------------------------------------------------------------------------


def _bad_inputs(device):
    h, w, tg = _random_problem(4, 16, 30, 11, device)
    return [
        (dict(hidden=h.float(), weight=w, targets=tg), "dtype"),
        (dict(hidden=h, weight=w.float(), targets=tg), "dtype"),
        (dict(hidden=h[0], weight=w, targets=tg), "dimensions"),
        (dict(hidden=h, weight=w[:, :8], targets=tg), "shape"),
        (dict(hidden=h, weight=w, targets=tg[:2]), "shape"),
        (dict(hidden=h, weight=w, targets=tg.int()), "dtype"),
        (dict(hidden=h, weight=w, targets=torch.tensor([0, 1, 30, 2], device=device)), "outside"),
        (dict(hidden=h, weight=w, targets=torch.tensor([0, -1, 3, 2], device=device)), "outside"),
        (dict(hidden=h.t().contiguous().t(), weight=w, targets=tg), "stride"),
        (dict(hidden=h, weight=w.t().contiguous().t(), targets=tg), "stride"),
        (dict(hidden=h, weight=w[:0], targets=tg), "V and E"),
        (dict(hidden=h, weight=w, targets=tg, temperature=0.0), "temperature"),
        (dict(hidden=h, weight=w, targets=tg, temperature=float("inf")), "temperature"),
    ]


@pytest.mark.parametrize("idx", range(13))
def test_bad_inputs_raise(device, idx):
    kwargs, word = _bad_inputs(device)[idx]
    with pytest.raises(InputError, match=word):
        linear_logp_triton(**kwargs)


# -- pitfalls ---------------------------------------------------------------------------------------


def test_pitfalls_p4_p5_fused_vocab_151936(device, contract):
    """One fused call at V = 151936, E = 4, on disjoint hidden dimensions:

    * P5 (E dims 0-1): h = [1, 1]; LM-head rows A = [40, 40.25], B = [40, 40], every other row
      zero there. FP32 logits A = 80.25, B = 80 -> logprob(A) = -0.5759394, logprob(B) =
      -0.8259394 (BF16 logits would give -0.6931472 for A).
    * P4 (E dims 2-3): h = 0 -> all logits 0 -> -ln(151936) = -11.931215; h = e2 with row 5 =
      -20 there -> -31.931208; h = e3 with the last row = +10 there -> -2.0665891.
    """
    tol = contract.tolerance("forward", "logprob", "float32")
    a, b, last = 7, 123457, P4_VOCAB - 1
    w = torch.zeros((P4_VOCAB, 4), dtype=torch.float32)
    w[a, :2] = torch.tensor([40.0, 40.25])
    w[b, :2] = torch.tensor([40.0, 40.0])
    w[5, 2] = -20.0
    w[last, 3] = 10.0
    h = torch.tensor([[1, 1, 0, 0], [1, 1, 0, 0], [0, 0, 0, 0], [0, 0, 1, 0], [0, 0, 0, 1]], dtype=torch.float32)
    tg = torch.tensor([a, b, 3, 5, last])
    w, h, tg = w.to(torch.bfloat16).to(device), h.to(torch.bfloat16).to(device), tg.to(device)
    out = linear_logp_triton(h, w, tg)
    expected = torch.tensor([-0.5759394, -0.8259394, -11.931215, -31.931208, -2.0665891], device=device)
    torch.testing.assert_close(out, expected, atol=tol.atol, rtol=tol.rtol)
    # the unfused FP32 path (lm_head-free: an FP32 GEMM of the same BF16 values + logp) agrees
    unfused = logp_triton(h.float() @ w.float().T, tg)
    torch.testing.assert_close(unfused, expected, atol=tol.atol, rtol=tol.rtol)
    # and BF16 logits show the pitfall
    base = SPEC.impls["torch_bf16"](hidden=h, weight=w, targets=tg)
    assert (base - expected).abs().max().item() > tol.atol


@pytest.mark.parametrize("temperature, expected", [(0.6, -0.0350524), (1.0, -0.1269280)])
def test_pitfall_p11_temperature(device, contract, temperature, expected):
    """V = 2, logits [2, 0] built as hidden [1] x weight [[2], [0]], target 0."""
    tol = contract.tolerance("forward", "logprob", "float32")
    h = torch.ones((1, 1), dtype=torch.bfloat16, device=device)
    w = torch.tensor([[2.0], [0.0]], dtype=torch.bfloat16, device=device)
    out = linear_logp_triton(h, w, torch.tensor([0], device=device), temperature)
    torch.testing.assert_close(out, torch.tensor([expected], device=device), atol=tol.atol, rtol=tol.rtol)


def test_backward_tiles_keep_the_bits(device):
    """The backward GEMMs' output tile is a launch setting: the default tiles and the 64 x 64 tiles
    before issue #33 give the same dhidden and dweight bits (every element the same GRAD_BLOCK steps,
    hi then lo, in the same order), with partial tiles in rows, V and E and two V chunks. Control:
    the same gradients from an FP32 matmul of the unfused reference path differ, so the
    comparison is sensitive to the order of the sums."""
    from rl_engine.ops.linear_logp import triton as ll

    v, t, e = CHUNK_V + 300, 150 if device.type == "cuda" else 70, 200
    h, w, tg = _random_problem(t, e, v, 11, device)
    out, rmax, rlog = ll.linear_logp_fwd(h, w, tg, 1.0)
    g = torch.randn(t, generator=make_generator(12)).to(device)
    new = ll.linear_logp_bwd(h, w, tg, g, rmax, rlog, 1.0, True, True)
    old = ll.linear_logp_bwd(h, w, tg, g, rmax, rlog, 1.0, True, True, grad_tile=(64, 64, 4, 3))
    assert ll.GRAD_TILE != (64, 64, 4, 3)
    assert bits_equal(new[0], old[0]) and bits_equal(new[1], old[1])
    dlogits = g[:, None] * (torch.nn.functional.one_hot(tg, v).float()
                            - torch.softmax(h.float() @ w.float().T, -1))
    assert not bits_equal(new[0], (dlogits @ w.float()).to(torch.bfloat16))


def test_forward_rows_per_tile_keep_the_bits(device):
    """The forward partial kernel's rows per logits tile is a launch setting (rows are independent;
    the V and E steps are declared): the 128-row tiles (``FWD_LAUNCH``) and the 256-row tiles of
    long calls (``FWD_LAUNCH_LONG``, 16 warps) give the 64-row tiles' logprobs, row max and log-sum
    bits over two V chunks with a partial last row tile; ``fwd_launch_for`` picks by T only.
    Control: temperature 0.5 changes the logprobs, so the comparison can fail."""
    from rl_engine.ops.linear_logp import triton as ll

    assert ll.FWD_LAUNCH == (128, 8, 3) and ll.FWD_LAUNCH_LONG == (256, 16, 3)
    assert ll.fwd_launch_for(ll.FWD_LONG_MIN_ROWS - 1) == ll.FWD_LAUNCH
    assert ll.fwd_launch_for(ll.FWD_LONG_MIN_ROWS) == ll.FWD_LAUNCH_LONG
    t = 300 if device.type == "cuda" else 70
    h, w, tg = _random_problem(t, 72, CHUNK_V + 300, 13, device)
    ref = ll.linear_logp_fwd(h, w, tg, 1.0, fwd_launch=(64, 4, 3))
    for launch in (ll.FWD_LAUNCH, ll.FWD_LAUNCH_LONG):
        for tma in (False, True):  # both loads: a layout TMA cannot read runs the pointer loads at any T
            wide = ll.linear_logp_fwd(h, w, tg, 1.0, fwd_launch=launch, tma=tma)
            assert all(bits_equal(a, b) for a, b in zip(wide, ref)), (launch, tma)
    assert not bits_equal(ll.linear_logp_fwd(h, w, tg, 0.5, fwd_launch=(64, 4, 3))[0], ref[0])


def test_tma_logits_tiles_keep_the_bits(device):
    """The logits tiles load through TMA descriptors on the H200 (``use_tma``) and through masked
    pointer loads elsewhere; both forms give the same logprobs, row max, log-sum, dhidden and
    dweight bits, with partial tiles in rows, V (two chunks, the last one partial) and E (72 =
    64 + a tail of 8 zero-filled by the TMA unit). Control: the pointer form on hidden whose E
    tail is zeroed gives other logprobs, so a TMA form that dropped the tail block would fail."""
    from rl_engine.ops.linear_logp import triton as ll

    t = 150 if device.type == "cuda" else 70
    h, w, tg = _random_problem(t, 72, CHUNK_V + 300, 17, device)
    ptr = ll.linear_logp_fwd(h, w, tg, 1.0, tma=False)
    tma = ll.linear_logp_fwd(h, w, tg, 1.0, tma=True)
    assert all(bits_equal(a, b) for a, b in zip(tma, ptr))
    g = torch.randn(t, generator=make_generator(18)).to(device)
    grads_ptr = ll.linear_logp_bwd(h, w, tg, g, ptr[1], ptr[2], 1.0, True, True, tma=False)
    grads_tma = ll.linear_logp_bwd(h, w, tg, g, ptr[1], ptr[2], 1.0, True, True, tma=True)
    assert bits_equal(grads_tma[0], grads_ptr[0]) and bits_equal(grads_tma[1], grads_ptr[1])
    cut = h.clone()
    cut[:, ll.BLOCK_E:] = 0
    assert not bits_equal(ll.linear_logp_fwd(cut, w, tg, 1.0, tma=False)[0], tma[0])


def test_tma_refuses_a_layout_it_cannot_read(device):
    """Forcing the TMA tiles on a hidden whose row pitch is not 16-byte aligned (E = 70) is refused
    before any launch, never read with a wrong pitch; ``use_tma`` never picks it."""
    from rl_engine.ops.linear_logp import triton as ll

    h, w, tg = _random_problem(5, 70, 300, 19, device)
    assert ll.tma_layout(h) is None and not ll.use_tma(h, w)
    with pytest.raises(ValueError, match="TMA"):
        ll.linear_logp_fwd(h, w, tg, 1.0, tma=True)


# -- the pinned row sum (ROW_SUM_PINNED; fragment_row_sum's order: tests/ops/test_fixed_order_sums.py)


@pytest.mark.parametrize("direction", ["forward", "gradient"])
def test_pinned_row_sum_keeps_accuracy_and_invariance(device, contract, direction, monkeypatch):
    """With ROW_SUM_PINNED the fused op meets the contract's accuracy and every invariance transform
    holds bitwise (with its control); the forward's saved log-sum (``log s``) differs from
    ``tl.sum``'s on some row of a two-chunk problem in the interpreter (NumPy's sum is another
    order), so the setting reached the kernel."""
    from rl_engine.ops.linear_logp import triton as ll
    from rl_engine.ops.logp import declared

    h, w, tg = _random_problem(70, 72, CHUNK_V + 300, 17, device, scale=1.0)
    monkeypatch.setattr(ll, "ROW_SUM_PINNED", False)
    monkeypatch.setattr(declared, "DECLARED_LSE", False)
    before = ll.linear_logp_fwd(h, w, tg, 1.0)[2]
    monkeypatch.setattr(ll, "ROW_SUM_PINNED", True)
    if direction == "forward":
        for case in _cases(device):
            check_forward_accuracy(SPEC, case, contract, out_dtype=torch.float32, tier="float32")
    else:
        for case in _grad_cases(device):
            check_backward_accuracy(SPEC, case, contract, relative=True)
    for name in ("batch", "chunk", "padding", "layout"):
        check_transform(SPEC, name, _grad_cases(device)[0], direction)
    if direction == "forward":
        assert not bits_equal(ll.linear_logp_fwd(h, w, tg, 1.0)[2], before), "ROW_SUM_PINNED did not reach the kernel"
