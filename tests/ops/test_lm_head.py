"""lm_head: FP32 logits (never rounded to BF16), accuracy, invariance transforms with negative
controls, pitfall P5's logits, and input validation."""

from __future__ import annotations

import pytest
import torch

from _helpers import (assert_one_and_odd_token_counts, bits_equal, check_backward_accuracy, check_forward_accuracy,
                      check_transform)
from rl_engine.errors import InputError
from rl_engine.ops import spec as spec_mod
from rl_engine.ops.lm_head import lm_head
from rl_engine.ops.lm_head.spec import SPEC, _token_counts

SMOKE = spec_mod.WORKLOADS["smoke"]
SEED = 4321
IMPL = SPEC.impls["triton_cuda_bf16"]


def _grad_case(device):
    return SPEC.build_grad_cases(SMOKE, SEED, device)[0]


def test_cases(device):
    cases = SPEC.build_cases(SMOKE, SEED, device)
    ts = [c.inputs["hidden"].shape[0] for c in cases]
    assert_one_and_odd_token_counts(ts)
    assert all(c.inputs["weight"].shape == (SMOKE.vocab, SMOKE.hidden) for c in cases)
    assert _token_counts(spec_mod.WORKLOADS["qwen3-8b"]) == [1, 257, 1027]


@pytest.mark.parametrize("idx", range(3), ids=lambda i: f"case{i}")
def test_forward_accuracy_fp32_logits(device, contract, idx):
    """Logits are FP32 with only FP32 accumulation error: the FP32 tier of the reduction class holds."""
    case = SPEC.build_cases(SMOKE, SEED, device)[idx]
    out = check_forward_accuracy(SPEC, case, contract, out_dtype=torch.float32, tier="float32", relative=False).out
    assert out.shape == (case.inputs["hidden"].shape[0], SMOKE.vocab)
    # Not rounded to BF16: some logits carry more than 8 significant bits.
    assert not torch.equal(out, out.to(torch.bfloat16).float())


def test_backward_accuracy(device, contract):
    res = check_backward_accuracy(SPEC, _grad_case(device), contract, upstream_offset=1)
    assert res.upstream[0].dtype == torch.float32


def test_public_api_and_torch_baseline(device):
    case = SPEC.build_cases(SMOKE, SEED, device)[1]
    out = lm_head(case.inputs["hidden"], case.inputs["weight"])
    assert bits_equal(out, IMPL(**case.inputs))
    base = SPEC.impls["torch_bf16"](**case.inputs)
    assert base.dtype == torch.float32 and torch.equal(base, base.to(torch.bfloat16).float())


def test_p5_logits_stay_fp32(device):
    """P5: h = [1, 1]; row A = [40, 40.25], row B = [40, 40], other rows 0 -> logits 80.25, 80, 0
    exactly (BF16 rounding would turn 80.25 into 80)."""
    v = SMOKE.vocab
    hidden = torch.ones((1, 2), dtype=torch.bfloat16, device=device)
    weight = torch.zeros((v, 2), dtype=torch.bfloat16, device=device)
    weight[0] = torch.tensor([40.0, 40.25], dtype=torch.bfloat16)
    weight[1] = torch.tensor([40.0, 40.0], dtype=torch.bfloat16)
    logits = IMPL(hidden=hidden, weight=weight)
    expect = torch.zeros((1, v), dtype=torch.float32, device=device)
    expect[0, 0] = 80.25
    expect[0, 1] = 80.0
    assert bits_equal(logits, expect)
    assert SPEC.impls["torch_bf16"](hidden=hidden, weight=weight)[0, 0].item() == 80.0


def test_row0_independent_of_t(device):
    case = SPEC.build_cases(SMOKE, SEED, device)[-1]
    h, w = case.inputs["hidden"], case.inputs["weight"]
    assert h.shape[0] == 33
    assert bits_equal(IMPL(hidden=h[:1], weight=w)[0], IMPL(hidden=h, weight=w)[0])


def test_decode_tiles_give_the_prefill_rows(device):
    """T <= 16 runs the decode tiles (16 x 128), T = 33 the prefill tiles (128 x 256): every row's
    FP32 logits are the same bits, at the Qwen3-8B vocabulary and hidden size on a GPU (a small
    vocabulary in the CPU interpreter). Control: a neighbouring row differs."""
    from rl_engine.ops.lm_head import triton as lm_triton

    v, e = (151936, 4096) if device.type == "cuda" else (300, 128)
    g = torch.Generator().manual_seed(3)
    w = (torch.randn(v, e, generator=g) * e ** -0.5).to(torch.bfloat16).to(device)
    h = torch.randn(33, e, generator=g).to(torch.bfloat16).to(device)
    big = lm_triton.lm_head_fwd(h, w)
    for rows in (slice(0, 1), slice(5, 8), slice(17, 33)):
        assert h[rows].shape[0] <= lm_triton.DECODE_M
        assert bits_equal(lm_triton.lm_head_fwd(h[rows], w), big[rows]), rows
    assert not bits_equal(lm_triton.lm_head_fwd(h[1:2], w), big[:1])


@pytest.mark.parametrize("direction", ["forward", "gradient"])
@pytest.mark.parametrize("name", ["batch", "chunk", "padding", "layout"])
def test_transform_bitwise_and_planted_control(device, name, direction):
    check_transform(SPEC, name, _grad_case(device), direction)


def test_tp_declared_not_applicable():
    assert isinstance(SPEC.transforms["tp"], str) and "vocab-parallel" in SPEC.transforms["tp"]
    assert SPEC.float_outputs_fp32 == ("logits",)


def test_bad_inputs_raise_input_error(device):
    h = torch.zeros((3, 8), dtype=torch.bfloat16, device=device)
    w = torch.zeros((5, 8), dtype=torch.bfloat16, device=device)
    with pytest.raises(InputError, match="dtype"):
        IMPL(hidden=h.float(), weight=w)
    with pytest.raises(InputError, match="dtype"):
        IMPL(hidden=h, weight=w.float())
    with pytest.raises(InputError, match="dimensions"):
        IMPL(hidden=h[0], weight=w)
    with pytest.raises(InputError, match="E differs"):
        IMPL(hidden=h, weight=torch.zeros((5, 7), dtype=torch.bfloat16, device=device))
    with pytest.raises(InputError, match="unit stride"):
        IMPL(hidden=h.t().contiguous().t(), weight=w)
    with pytest.raises(InputError, match="device"):
        IMPL(hidden=h, weight=torch.zeros((5, 8), dtype=torch.bfloat16, device="meta"))
