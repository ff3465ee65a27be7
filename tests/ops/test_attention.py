"""Tests of attention: accuracy vs the FP32 reference, bitwise invariance (batch, chunk, padding,
layout) with negative controls, pitfalls P8 (prefill + decode == one pass) and P10 (no visible
key -> 0), empty and zero-length batches, and bad-input errors.

Under the CPU interpreter ``mma`` upcasts BF16 operands to FP32 and NumPy computes the products
(exact in FP32); only the summation order can differ from the GPU, so the bitwise checks here prove
the kernels' structure (fixed KV blocks and order, masked blocks add nothing) and the GPU run
proves the tensor-core arithmetic.
"""

from __future__ import annotations

import math

import pytest
import torch

from _helpers import (SMOKE, bits_equal, cancelling_rows, check_backward_accuracy, check_forward_accuracy,
                      check_transform, control_caught, declared_head_dim_sum, differing, int_bits)
from rl_engine.errors import InputError
from rl_engine.ops.attention import attention, attention_decode
from rl_engine.ops.attention import triton as attn_triton
from rl_engine.ops.attention._checks import check_varlen
from rl_engine.ops.attention.reference import attention_decode_reference, attention_reference
from rl_engine.ops.attention.spec import GRAD_INPUTS, SPEC, make_case
from rl_engine.ops.attention.api import attention_decode_triton, attention_triton
from rl_engine.ops.execute import make_upstream, run_forward, run_gradient, upcast_inputs
from rl_engine.ops.spec import make_generator, randn

LONG_LENS = (1, 0, 13, 70, 150)
"""Sequences longer than one KV block (64) and one query block (64), to exercise the loops."""


def assert_bitwise(a: torch.Tensor, b: torch.Tensor, what: str) -> None:
    assert a.shape == b.shape, f"{what}: shapes {list(a.shape)} vs {list(b.shape)}"
    assert a.dtype == b.dtype, f"{what}: dtypes {a.dtype} vs {b.dtype}"
    same = int_bits(a) == int_bits(b)
    if not bool(same.all()):
        idx = tuple(int(i) for i in torch.nonzero(~same)[0])
        raise AssertionError(f"{what}: {int((~same).sum())} elements differ, first at {list(idx)}: "
                             f"{float(a[idx])} vs {float(b[idx])}")


@pytest.fixture(scope="module")
def cases(device):
    return {c.id: c for c in SPEC.build_cases(SMOKE, 0, device)}


@pytest.fixture(scope="module")
def grad_case(device):
    return SPEC.build_grad_cases(SMOKE, 100, device)[0]


# ---------------------------------------------------------------------------------------------
# Accuracy
# ---------------------------------------------------------------------------------------------
def _accuracy_cases(device):
    smoke = SPEC.build_cases(SMOKE, 0, device)
    return smoke + [make_case(SMOKE, 5, device, LONG_LENS), make_case(SMOKE, 6, device, LONG_LENS, (1, 0, 5, 33, 77))]


@pytest.mark.parametrize("idx", range(5), ids=["prefill", "chunked", "decode-step", "long", "long-chunked"])
def test_forward_accuracy(idx, device, contract):
    case = _accuracy_cases(device)[idx]
    out = check_forward_accuracy(SPEC, case, contract, relative=False).out
    assert out.shape == case.inputs["q"].shape


def test_decode_accuracy(device, contract):
    tol = contract.tolerance("forward", contract.op_class("attention"))
    g = make_generator(11)
    b, s_max = 5, 90
    q = randn((b, SMOKE.heads, SMOKE.head_dim), g, device=device)
    kc = randn((b, s_max, SMOKE.kv_heads, SMOKE.head_dim), g, device=device)
    vc = randn((b, s_max, SMOKE.kv_heads, SMOKE.head_dim), g, device=device)
    lens = torch.tensor([1, 17, 64, 65, 90], dtype=torch.int32, device=device)
    scale = SMOKE.head_dim ** -0.5
    out = attention_decode_triton(q, kc, vc, lens, scale)
    ref = attention_decode_reference(q.float(), kc.float(), vc.float(), lens, scale)
    torch.testing.assert_close(out.float(), ref, atol=tol.atol, rtol=tol.rtol)


@pytest.mark.parametrize("which", ["smoke-grad", "long", "long-chunked"])
def test_backward_accuracy(which, device, contract, grad_case):
    if which == "smoke-grad":
        case = grad_case
    elif which == "long":
        case = make_case(SMOKE, 7, device, LONG_LENS)
    else:
        case = make_case(SMOKE, 8, device, LONG_LENS, (1, 0, 5, 33, 77))
    check_backward_accuracy(SPEC, case, contract, names=GRAD_INPUTS)


def test_backward_is_deterministic(device):
    case = make_case(SMOKE, 9, device, (3, 70))
    up = make_upstream(run_forward(attention_triton, case.inputs), 1)
    first = run_gradient(attention_triton, case.inputs, GRAD_INPUTS, upstream=up)[1]
    second = run_gradient(attention_triton, case.inputs, GRAD_INPUTS, upstream=up)[1]
    for n in GRAD_INPUTS:
        assert_bitwise(first[n], second[n], f"d{n} run twice")


# ---------------------------------------------------------------------------------------------
# Invariance (bitwise) and negative controls
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["batch", "chunk", "padding", "layout"])
def test_invariance_forward(name, cases):
    for case in cases.values():
        check_transform(SPEC, name, case, "forward")


@pytest.mark.parametrize("name", ["batch", "chunk", "padding", "layout"])
def test_invariance_gradient(name, grad_case):
    check_transform(SPEC, name, grad_case, "gradient")


def test_tp_is_declared_not_applicable():
    assert isinstance(SPEC.transforms["tp"], str) and "N/A" in SPEC.transforms["tp"]


def test_chunk_control_is_caught(cases):
    """A KV block size picked from the sequence lengths (16 for short calls) breaks prefill/decode parity."""
    case = next(c for c in cases.values() if c.id.startswith("T34-"))
    pairs = SPEC.transforms["chunk"](SPEC.controls["chunk"], case, "forward", False)
    assert control_caught(pairs), "the chunk check did not catch a size-dependent KV block"


def test_rows_independent_of_query_block_size(device):
    """The same rows with a 64- and a 128-row query tile (internal launcher) are bitwise equal.

    Only tiles of 64 rows or more are claimed: on the H200 (triton 3.6) 16- and 32-row tiles are
    compiled to ``mma.sync`` instead of ``wgmma`` and differed in the last bit for about 2 % of
    the rows, so every path (prefill, chunk, decode, dQ) uses a 64-row tile. In the interpreter
    (NumPy products) 16 and 32 rows also match, which this test does not rely on.
    """
    case = make_case(SMOKE, 12, device, (150, 37))
    inp = case.inputs
    attention_triton(**inp)  # validates and prepares the device (interpreter rounding)
    plan = check_varlen(inp["q"], inp["k"], inp["v"], inp["cu_seqlens_q"], inp["cu_seqlens_k"], inp["scale"],
                        dtype=torch.bfloat16, kernel=True)
    outs = {bm: attn_triton.attention_fwd(inp["q"], inp["k"], inp["v"], inp["cu_seqlens_q"], inp["cu_seqlens_k"],
                                     inp["scale"], plan, block_m=bm)[0] for bm in (64, 128)}
    for bm, o in outs.items():
        assert_bitwise(outs[attn_triton.BLOCK_M], o, f"BLOCK_M {bm} vs {attn_triton.BLOCK_M}")


def test_qk_ahead_gives_the_plain_loops_bits(device):
    """The forward with the next block's scores issued ahead (``qk_ahead``) == the plain loop, bitwise,
    out and lse, on sequences with 0, 1 and several whole KV blocks before the diagonal (150, 37, 64 and 3
    tokens; 128-row tiles too). The schedule is the only difference, so on the GPU too (the sweep tool's
    ``a`` configurations check it there); this checks the loop's bounds (the prologue, the last whole block)."""
    case = make_case(SMOKE, 12, device, (150, 37, 64, 3))
    inp = case.inputs
    attention_triton(**inp)
    plan = check_varlen(inp["q"], inp["k"], inp["v"], inp["cu_seqlens_q"], inp["cu_seqlens_k"], inp["scale"],
                        dtype=torch.bfloat16, kernel=True)
    args = (inp["q"], inp["k"], inp["v"], inp["cu_seqlens_q"], inp["cu_seqlens_k"], inp["scale"], plan)
    for bm in (64, 128):
        plain = attn_triton.attention_fwd(*args, block_m=bm, qk_ahead=False)
        ahead = attn_triton.attention_fwd(*args, block_m=bm, qk_ahead=True)
        assert_bitwise(plain[0], ahead[0], f"out, BLOCK_M {bm}")
        assert_bitwise(plain[1], ahead[1], f"lse, BLOCK_M {bm}")


def test_decode_of_every_query_equals_prefill(device):
    """Every query of a 150-token sequence as one decode entry (batched) == its prefill row, bitwise."""
    _assert_every_query_decodes_as_prefilled(make_case(SMOKE, 15, device, (150,)), device)


def _assert_every_query_decodes_as_prefilled(case, device):
    """Every query of ``case``'s single sequence as one decode entry (batched) == its prefill row."""
    inp = case.inputs
    full = attention_triton(**inp)
    n = inp["q"].shape[0]
    k_cache = inp["k"].unsqueeze(0).expand(n, -1, -1, -1)
    v_cache = inp["v"].unsqueeze(0).expand(n, -1, -1, -1)
    lens = torch.arange(1, n + 1, dtype=torch.int32, device=device)
    assert_bitwise(full, attention_decode_triton(inp["q"], k_cache, v_cache, lens, inp["scale"]), "decode vs prefill")


# ---------------------------------------------------------------------------------------------
# The pinned sums (ROW_SUM_PINNED; fragment_row_sum's order: tests/ops/test_fixed_order_sums.py)
# ---------------------------------------------------------------------------------------------
def test_pinned_row_sum_keeps_accuracy_invariance_and_decode_parity(device, contract, cases, monkeypatch):
    """With ROW_SUM_PINNED the forward meets the contract's accuracy, every forward invariance transform
    holds bitwise, and every query of a 150-token sequence as a decode entry equals its prefill row.
    Its saved FP32 lse differs from tl.sum's on some row of a long case in the interpreter (NumPy's
    sum is another order), so the setting reached the kernels."""
    case = make_case(SMOKE, 15, device, (150,))
    monkeypatch.setattr(attn_triton, "ROW_SUM_PINNED", False)
    lse_before = _forward_lse(case)
    monkeypatch.setattr(attn_triton, "ROW_SUM_PINNED", True)
    for acc_case in _accuracy_cases(device):
        check_forward_accuracy(SPEC, acc_case, contract, relative=False)
    for name in ("batch", "chunk", "padding", "layout"):
        for c in cases.values():
            check_transform(SPEC, name, c, "forward")
    _assert_every_query_decodes_as_prefilled(case, device)
    assert not torch.equal(_forward_lse(case).view(torch.int32), lse_before.view(torch.int32)), \
        "ROW_SUM_PINNED did not reach the kernels"


@pytest.mark.parametrize("d", [16, 128, 256])
def test_head_dim_sum_adds_in_the_declared_order(d, device):
    """_head_dim_sum (the backward's pinned delta sum) gives the declared order's bits on rows where
    the order shows (a cancelling 2^24 pair among small values). Control: a right fold of each group
    of 8 (Triton 3.6's ``tl.sum`` per thread on sm_90), then the same butterfly, differs on them."""
    import triton
    import triton.language as tl

    @triton.jit
    def head_dim_sum_kernel(x_ptr, out_ptr, M: tl.constexpr, D: tl.constexpr):
        rows = tl.arange(0, M)
        cols = tl.arange(0, D)
        x = tl.load(x_ptr + rows[:, None] * D + cols[None, :])
        tl.store(out_ptr + rows, attn_triton._head_dim_sum(x, D))

    x = cancelling_rows(16, d, seed=7 + d, step=5)
    out = torch.empty(16, dtype=torch.float32, device=device)
    head_dim_sum_kernel[(1,)](x.to(device), out, M=16, D=d)  # (on a GPU the kernel needs device tensors)
    out = out.cpu()
    expected = declared_head_dim_sum(x)
    assert_bitwise(out, expected, f"_head_dim_sum vs the declared order (D = {d})")
    groups = x.reshape(16, d // 8, 8)
    folded = groups[..., 7].clone()
    for r in range(6, -1, -1):
        folded = groups[..., r] + folded
    control = folded
    while control.shape[1] > 1:
        control = control.reshape(16, 2, control.shape[1] // 2)
        control = control[:, 0] + control[:, 1]
    assert not torch.equal(control.reshape(16).view(torch.int32), expected.view(torch.int32)), \
        "the rows do not tell the orders apart: the check could not fail"


def test_pinned_sums_keep_gradient_accuracy_and_invariance(device, contract, grad_case, monkeypatch):
    """With ROW_SUM_PINNED the backward (its delta in _head_dim_sum's order, the forward's lse in
    fragment_row_sum's) meets the contract's gradient accuracy and every gradient invariance transform holds
    bitwise with its control."""
    monkeypatch.setattr(attn_triton, "ROW_SUM_PINNED", True)
    check_backward_accuracy(SPEC, grad_case, contract, names=GRAD_INPUTS)
    check_backward_accuracy(SPEC, make_case(SMOKE, 7, device, LONG_LENS), contract, names=GRAD_INPUTS)
    for name in ("batch", "chunk", "padding", "layout"):
        check_transform(SPEC, name, grad_case, "gradient")


def _forward_lse(case) -> torch.Tensor:
    """The FP32 lse [H, T] the forward saves for the backward (the internal launcher)."""
    inp = case.inputs
    attention_triton(**inp)  # validates and prepares the device (interpreter rounding)
    plan = check_varlen(inp["q"], inp["k"], inp["v"], inp["cu_seqlens_q"], inp["cu_seqlens_k"], inp["scale"],
                        dtype=torch.bfloat16, kernel=True)
    return attn_triton.attention_fwd(inp["q"], inp["k"], inp["v"], inp["cu_seqlens_q"], inp["cu_seqlens_k"],
                                     inp["scale"], plan)[1]


@pytest.mark.parametrize("d_split", [2, 4, 8])
def test_decode_head_dim_split_keeps_the_bits(d_split, device):
    """A decode launch whose programs each own D / d_split output columns gives the prefill rows'
    bits, at Qwen3-8B head shapes (32 query heads over 8 KV heads, D = 128; 8 over 2 on the CPU), with lengths that end
    inside a KV block and NaN written past every length (masked means absent). Control: a wrong
    column offset (a split that loads the wrong V slice) must differ."""
    g = torch.Generator(device="cpu").manual_seed(40 + d_split)
    cpu = device.type == "cpu"  # the interpreter runs every program in Python: fewer heads there
    h, hkv, d = (8, 2, 128) if cpu else (32, 8, 128)
    lens_list = (1, 63, 130) if cpu else (1, 63, 64, 130, 1000, 1025)
    s_max = max(lens_list) + 7
    b = len(lens_list)
    kc = torch.randn((b, s_max, hkv, d), generator=g).to(torch.bfloat16)
    vc = torch.randn((b, s_max, hkv, d), generator=g).to(torch.bfloat16)
    for i, n in enumerate(lens_list):
        kc[i, n:] = float("nan")
        vc[i, n:] = float("nan")
    q = torch.randn((b, h, d), generator=g).to(torch.bfloat16)
    kc, vc, q = kc.to(device), vc.to(device), q.to(device)
    lens = torch.tensor(lens_list, dtype=torch.int32, device=device)
    scale = d ** -0.5
    whole = attn_triton.attention_decode_fwd(q, kc, vc, lens, scale, d_split=1)
    split = attn_triton.attention_decode_fwd(q, kc, vc, lens, scale, d_split=d_split)
    assert_bitwise(whole, split, f"d_split {d_split} vs 1")
    # the prefill rows: each sequence's last query as a varlen forward over its own keys
    for i, n in enumerate(lens_list):
        cu = torch.tensor([0, 1], dtype=torch.int32, device=device)
        cuk = torch.tensor([0, n], dtype=torch.int32, device=device)
        pre = attention_triton(q[i : i + 1], kc[i, :n], vc[i, :n], cu, cuk, scale)
        assert_bitwise(pre, split[i : i + 1], f"d_split {d_split}, length {n}: decode vs prefill")
    shifted = attn_triton.attention_decode_fwd(q, kc, vc[:, :, :, list(range(1, d)) + [0]].contiguous(), lens, scale,
                                               d_split=d_split)
    assert not torch.equal(shifted.view(torch.int16), split.view(torch.int16)), "the control did not change the bits"


# ---------------------------------------------------------------------------------------------
# Pitfalls
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("prefill,steps", [(16, 8), (120, 16)], ids=["P8-16+8", "P8-120+16-crosses-kv-block"])
def test_p8_prefill_then_decode_equals_one_pass(prefill, steps, device):
    """P8: a prefill then decode steps through a static KV cache == one teacher-forced pass, bitwise."""
    total = prefill + steps
    g = make_generator(21)
    h, hkv, d = SMOKE.heads, SMOKE.kv_heads, SMOKE.head_dim
    q = randn((total, h, d), g, device=device)
    k = randn((total, hkv, d), g, device=device)
    v = randn((total, hkv, d), g, device=device)
    scale = d ** -0.5
    cu = torch.tensor([0, total], dtype=torch.int32, device=device)
    one_pass = attention_triton(q, k, v, cu, cu, scale)

    s_max = total + 5
    k_cache = torch.full((1, s_max, hkv, d), float("nan"), dtype=torch.bfloat16, device=device)
    v_cache = torch.full((1, s_max, hkv, d), float("nan"), dtype=torch.bfloat16, device=device)
    k_cache[0, :prefill] = k[:prefill]
    v_cache[0, :prefill] = v[:prefill]
    cp = torch.tensor([0, prefill], dtype=torch.int32, device=device)
    outs = [attention_triton(q[:prefill], k[:prefill], v[:prefill], cp, cp, scale)]
    for t in range(prefill, total):
        k_cache[0, t] = k[t]
        v_cache[0, t] = v[t]
        lens = torch.tensor([t + 1], dtype=torch.int32, device=device)
        outs.append(attention_decode_triton(q[t : t + 1], k_cache, v_cache, lens, scale))
    assert_bitwise(one_pass, torch.cat(outs, 0), f"{prefill}-token prefill + {steps} decode steps vs one pass")


def test_p10_row_without_keys_is_zero_and_neighbours_unchanged(device):
    """P10 adapted to the API: 4 queries of one head; row 1 has no visible key (decode with
    cache_seqlens 0). Row 1 is exactly 0; rows 0, 2, 3 equal the run without that mask, bitwise."""
    d = 16  # the kernel's smallest head dim; the pitfall's head dim 2 padded with zeros
    g = make_generator(31)
    q2 = randn((4, 1, 2), g, device=device)
    k2 = randn((4, 1, 2), g, device=device)
    v2 = randn((4, 1, 2), g, device=device)
    q = torch.zeros((4, 1, d), dtype=torch.bfloat16, device=device)
    k = torch.zeros((4, 1, d), dtype=torch.bfloat16, device=device)
    v = torch.zeros((4, 1, d), dtype=torch.bfloat16, device=device)
    q[..., :2], k[..., :2], v[..., :2] = q2, k2, v2
    scale = 2 ** -0.5
    # Query i sits at position i of one 4-token sequence: decode entry i sees keys 0..i.
    cache_k = k.unsqueeze(0).expand(4, -1, -1, -1)
    cache_v = v.unsqueeze(0).expand(4, -1, -1, -1)
    unmasked = attention_decode_triton(q, cache_k, cache_v, torch.tensor([1, 2, 3, 4], dtype=torch.int32,
                                                                         device=device), scale)
    masked = attention_decode_triton(q, cache_k, cache_v, torch.tensor([1, 0, 3, 4], dtype=torch.int32,
                                                                       device=device), scale)
    assert bool((int_bits(masked[1]) == 0).all()), f"row 1 with no visible key is not exactly +0: {masked[1]}"
    for r in (0, 2, 3):
        assert_bitwise(unmasked[r], masked[r], f"row {r}")
    # The same rows through the varlen path (one 4-token prefill) are bitwise the decode rows.
    cu = torch.tensor([0, 4], dtype=torch.int32, device=device)
    assert_bitwise(attention_triton(q, k, v, cu, cu, scale), unmasked, "prefill vs decode rows")
    ref = attention_decode_reference(q.float(), cache_k.float(), cache_v.float(),
                                     torch.tensor([1, 0, 3, 4], dtype=torch.int32, device=device), scale)
    assert bool((ref[1] == 0).all())


# ---------------------------------------------------------------------------------------------
# Empty and zero-length inputs
# ---------------------------------------------------------------------------------------------
def test_empty_batch(device):
    h, hkv, d = SMOKE.heads, SMOKE.kv_heads, SMOKE.head_dim
    q = torch.zeros((0, h, d), dtype=torch.bfloat16, device=device, requires_grad=True)
    k = torch.zeros((0, hkv, d), dtype=torch.bfloat16, device=device, requires_grad=True)
    v = torch.zeros((0, hkv, d), dtype=torch.bfloat16, device=device, requires_grad=True)
    cu = torch.zeros(1, dtype=torch.int32, device=device)
    out = attention_triton(q, k, v, cu, cu, 0.5)
    assert out.shape == (0, h, d) and out.dtype == torch.bfloat16
    out.sum().backward()
    assert q.grad.shape == q.shape and k.grad.shape == k.shape
    dec = attention_decode_triton(torch.zeros((0, h, d), dtype=torch.bfloat16, device=device),
                                  torch.zeros((0, 4, hkv, d), dtype=torch.bfloat16, device=device),
                                  torch.zeros((0, 4, hkv, d), dtype=torch.bfloat16, device=device),
                                  torch.zeros(0, dtype=torch.int32, device=device), 0.5)
    assert dec.shape == (0, h, d)


def test_zero_length_sequences(device):
    h, hkv, d = SMOKE.heads, SMOKE.kv_heads, SMOKE.head_dim
    # Only zero-length sequences.
    cu = torch.zeros(4, dtype=torch.int32, device=device)
    q = torch.zeros((0, h, d), dtype=torch.bfloat16, device=device)
    kv = torch.zeros((0, hkv, d), dtype=torch.bfloat16, device=device)
    assert attention_triton(q, kv, kv, cu, cu, 0.5).shape == (0, h, d)
    # Keys but no queries (Lq = 0 < Lk): nothing to compute, and dk / dv of those keys are 0.
    case = make_case(SMOKE, 13, device, (5, 0, 3), (0, 0, 3))
    out, grads, _ = run_gradient(attention_triton, case.inputs, GRAD_INPUTS)
    ref = run_forward(attention_reference, upcast_inputs(case.inputs))[0]
    assert out[0].shape == ref.shape
    assert bool((int_bits(grads["k"][:5]) == 0).all()) and bool((int_bits(grads["v"][:5]) == 0).all())


# ---------------------------------------------------------------------------------------------
# Public API and bad inputs
# ---------------------------------------------------------------------------------------------
def test_public_api_routes_backends(cases, device):
    case = next(iter(cases.values()))
    out = attention(**case.inputs)
    assert_bitwise(out, attention_triton(**case.inputs), "attention() vs attention_triton")
    ref = attention(**upcast_inputs(case.inputs), backend="reference_fp32")
    assert ref.dtype == torch.float32
    g = make_generator(3)
    q = randn((2, SMOKE.heads, SMOKE.head_dim), g, device=device)
    kc = randn((2, 8, SMOKE.kv_heads, SMOKE.head_dim), g, device=device)
    lens = torch.tensor([3, 8], dtype=torch.int32, device=device)
    assert_bitwise(attention_decode(q, kc, kc, lens, 0.5), attention_decode_triton(q, kc, kc, lens, 0.5), "decode")
    assert attention_decode(q, kc, kc, lens, 0.5, backend="torch_bf16").shape == q.shape


def _good(device, tq=5, tk=7, h=4, hkv=2, d=16):
    g = make_generator(1)
    return dict(q=randn((tq, h, d), g, device=device), k=randn((tk, hkv, d), g, device=device),
                v=randn((tk, hkv, d), g, device=device),
                cu_seqlens_q=torch.tensor([0, 2, tq], dtype=torch.int32, device=device),
                cu_seqlens_k=torch.tensor([0, 3, tk], dtype=torch.int32, device=device), scale=0.25)


BAD_VARLEN = {
    "q fp16": (lambda a: {**a, "q": a["q"].half()}, "dtype"),
    "k fp32": (lambda a: {**a, "k": a["k"].float()}, "dtype"),
    "q 2-D": (lambda a: {**a, "q": a["q"][:, 0]}, "dimensions"),
    "v shape": (lambda a: {**a, "v": a["v"][:, :1]}, "shape of k"),
    "H % Hkv": (lambda a: {**a, "q": torch.cat([a["q"], a["q"][:, :1]], 1)}, "H % Hkv"),
    "D mismatch": (lambda a: {**a, "q": torch.cat([a["q"], a["q"]], 2)}, "head dim"),
    "D not pow2": (lambda a: {**a, "q": a["q"][..., :12].contiguous(), "k": a["k"][..., :12].contiguous(),
                              "v": a["v"][..., :12].contiguous()}, "power of two"),
    "D stride": (lambda a: {**a, "q": a["q"].transpose(0, 2).contiguous().transpose(0, 2)}, "unit stride"),
    "cu int64": (lambda a: {**a, "cu_seqlens_q": a["cu_seqlens_q"].long()}, "int32"),
    "cu start": (lambda a: {**a, "cu_seqlens_q": a["cu_seqlens_q"] + 1}, "start at 0"),
    "cu decreasing": (lambda a: {**a, "cu_seqlens_k": torch.tensor([0, 5, 3, 7], dtype=torch.int32)}, "non-decreasing"),
    "cu total": (lambda a: {**a, "cu_seqlens_k": torch.tensor([0, 3, 6], dtype=torch.int32)}, "packed tokens"),
    "cu count": (lambda a: {**a, "cu_seqlens_k": torch.tensor([0, 3, 5, 7], dtype=torch.int32)}, "sequences"),
    "Lq > Lk": (lambda a: {**a, "cu_seqlens_q": torch.tensor([0, 4, 5], dtype=torch.int32)}, "Lq <= Lk"),
    "scale nan": (lambda a: {**a, "scale": math.nan}, "finite"),
    "scale tensor": (lambda a: {**a, "scale": torch.tensor(0.5)}, "Python float"),
}


@pytest.mark.parametrize("name", list(BAD_VARLEN))
def test_bad_varlen_inputs_raise(name, device):
    make, match = BAD_VARLEN[name]
    args = make(_good(device))
    args = {n: (t.to(device) if isinstance(t, torch.Tensor) else t) for n, t in args.items()}
    with pytest.raises(InputError, match=match):
        attention_triton(**args)


CU_VALUE_FAULTS = ("cu start", "cu decreasing", "cu total", "Lq > Lk")
"""Faults in the cu_seqlens values: a caller that hands back a plan promises those values, so these
are only caught where cu_seqlens is read (without a plan)."""


@pytest.mark.parametrize("name", [n for n in BAD_VARLEN if n not in CU_VALUE_FAULTS])
def test_bad_varlen_inputs_raise_with_a_plan(name, device):
    """Handing back the plan of a good call skips only the read of cu_seqlens: every check of the
    tensors (dtype, shape, stride, heads, devices, scale, the cu_seqlens lengths) still raises."""
    good = _good(device)
    plan = check_varlen(*good.values(), dtype=torch.bfloat16, kernel=True)
    assert bits_equal(attention_triton(**good, plan=plan), attention_triton(**good))
    make, match = BAD_VARLEN[name]
    args = {n: (t.to(device) if isinstance(t, torch.Tensor) else t) for n, t in make(good).items()}
    with pytest.raises(InputError, match=match if name != "cu count" else "plan"):
        attention_triton(**args, plan=plan)


def test_a_plan_that_does_not_fit_raises(device):
    """A plan built for other token counts or another batch, or not a VarlenPlan at all."""
    good = _good(device)
    other = _good(device, tq=6, tk=8)
    plan = check_varlen(*other.values(), dtype=torch.bfloat16, kernel=True)
    with pytest.raises(InputError, match="plan: its cu_seqlens_q ends at 6"):
        attention_triton(**good, plan=plan)
    with pytest.raises(InputError, match="plan: expected the VarlenPlan"):
        attention_triton(**good, plan=(2, 3, 4))


def test_bad_decode_inputs_raise(device):
    g = make_generator(2)
    q = randn((2, 4, 16), g, device=device)
    kc = randn((2, 6, 2, 16), g, device=device)
    lens = torch.tensor([3, 6], dtype=torch.int32, device=device)
    with pytest.raises(InputError, match="outside"):
        attention_decode_triton(q, kc, kc, torch.tensor([3, 7], dtype=torch.int32, device=device), 0.5)
    with pytest.raises(InputError, match="outside"):
        attention_decode_triton(q, kc, kc, torch.tensor([-1, 2], dtype=torch.int32, device=device), 0.5)
    with pytest.raises(InputError, match="batch"):
        attention_decode_triton(q[:1], kc, kc, lens[:1], 0.5)
    with pytest.raises(InputError, match="dtype"):
        attention_decode_triton(q, kc, kc, lens.long(), 0.5)
    with pytest.raises(InputError, match="dtype"):
        attention_decode_triton(q.float(), kc, kc, lens, 0.5)
    with pytest.raises(InputError, match="H % Hkv"):
        attention_decode_triton(q[:, :3], kc, kc, lens, 0.5)
    with pytest.raises(InputError, match="inference only"):
        attention_decode_triton(q.clone().requires_grad_(True), kc, kc, lens, 0.5)


def test_chunk_invariance_across_kv_blocks(device):
    """Chunked prefill, decode steps and chunked dq on a sequence longer than two KV blocks."""
    case = make_case(SMOKE, 14, device, (13, 150))
    impl = SPEC.impls["triton_cuda_bf16"]
    for direction in ("forward", "gradient"):
        bad = differing(SPEC.transforms["chunk"](impl, case, direction, False))
        assert not bad, f"chunk {direction}: not bitwise equal: {bad}"
    control = SPEC.transforms["chunk"](SPEC.controls["chunk"], case, "forward", False)
    assert control_caught(control), "the size-dependent KV block was not caught"


def test_backward_launch_settings_keep_the_bits(device):
    """The dK/dV kernel's KV rows per program and the dQ kernel's query rows per program, and the
    reduction steps of both, are launch settings for the sweep (``tools/attention_prefill_sweep.py
    --backward``): on a varlen batch whose sequences end inside blocks, 128-row programs and
    32-row steps give the default launch's dq, dk, dv bits, and so do the dK/dV kernel's TMA loads
    of its complete query blocks; a step that is not a positive multiple of 16, or TMA loads of a
    q whose heads are not adjacent, are refused. Control: another scale changes every gradient, so
    the comparison can fail."""
    from rl_engine.ops.attention._checks import LaunchPlan

    g = make_generator(91)
    lens = [150, 37, 1]
    t = sum(lens)
    q = randn((t, 4, 16), g, device=device)
    k = randn((t, 2, 16), g, device=device)
    v = randn((t, 2, 16), g, device=device)
    do = randn((t, 4, 16), g, device=device)
    cu = torch.tensor([0, 150, 187, 188], dtype=torch.int32, device=device)
    plan = LaunchPlan(len(lens), max(lens), max(lens))
    out, lse = attn_triton.attention_fwd(q, k, v, cu, cu, 0.25, plan)
    ref = attn_triton.attention_bwd(q, k, v, out, lse, do, cu, cu, 0.25, plan)
    wide = attn_triton.attention_bwd(q, k, v, out, lse, do, cu, cu, 0.25, plan, dkdv_launch=(128, 8, 2),
                                     dq_launch=(128, 8, 2))
    assert all(bits_equal(x, y) for x, y in zip(wide, ref))
    # 32-row reduction steps (query rows per dK/dV step, keys per dQ step): the same accumulators
    # fed in the same order (on the GPU, the same 16-wide tensor-core chunks)
    for dkdv, dq in (((64, 4, 2, 32), (64, 4, 2, 32)), ((128, 8, 2, 32), (128, 8, 2, 32))):
        steps = attn_triton.attention_bwd(q, k, v, out, lse, do, cu, cu, 0.25, plan, dkdv_launch=dkdv, dq_launch=dq)
        assert all(bits_equal(x, y) for x, y in zip(steps, ref)), (dkdv, dq)
    for bad in ((64, 4, 2, 24), (64, 4, 2, 0), (64, 4)):
        with pytest.raises(ValueError, match="multiple of 16"):
            attn_triton.attention_bwd(q, k, v, out, lse, do, cu, cu, 0.25, plan, dkdv_launch=bad)
    # the dK/dV kernel's complete query blocks through TMA descriptors (the 150-token sequence has
    # complete and partial blocks at both steps; the 1-token one only a partial block)
    for dkdv in ((64, 4, 2), (64, 4, 2, 32)):
        tma = attn_triton.attention_bwd(q, k, v, out, lse, do, cu, cu, 0.25, plan, dkdv_launch=dkdv, dkdv_tma=True)
        assert all(bits_equal(x, y) for x, y in zip(tma, ref)), dkdv
    apart = torch.empty((4, t, 16), dtype=q.dtype, device=device).transpose(0, 1)  # heads not adjacent
    apart.copy_(q)
    with pytest.raises(ValueError, match="TMA loads need q and do"):
        attn_triton.attention_bwd(apart, k, v, out, lse, do, cu, cu, 0.25, plan, dkdv_tma=True)
    other = attn_triton.attention_bwd(q, k, v, out, lse, do, cu, cu, 0.5, plan)
    assert not any(bits_equal(x, y) for x, y in zip(other, ref))
