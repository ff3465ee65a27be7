"""Tests of the token embedding (forward exact copies, deterministic segment-sum backward, P9)."""

from __future__ import annotations

import pytest
import torch

from _helpers import (assert_one_and_odd_token_counts, bits_equal, case_fixtures, check_backward_accuracy,
                      check_forward_accuracy, check_transform, gradients)
from rl_engine.errors import InputError
from rl_engine.ops.embedding import embedding
from rl_engine.ops.embedding import triton as emb_triton
from rl_engine.ops.embedding.spec import SPEC
from rl_engine.ops.execute import run_forward
from rl_engine.ops.spec import make_generator, randn

SEED = 1234
cases, grad_case = case_fixtures(SPEC, SEED)


def test_cases_cover_one_and_odd_token_counts(cases):
    assert_one_and_odd_token_counts([c.inputs["ids"].shape[0] for c in cases])


def test_forward_exact_rows(cases, contract):
    for case in cases:
        res = check_forward_accuracy(SPEC, case, contract, relative=False)
        (hf,) = run_forward(SPEC.impls["torch_bf16"], case.inputs)
        assert torch.equal(res.out.float(), res.ref), f"{case.id}: rows are not exact copies"
        assert bits_equal(res.out, hf), case.id


def test_backward_segment_sums(grad_case, contract):
    res = check_backward_accuracy(SPEC, grad_case, contract)
    up, dw, dw_ref = res.upstream, res.grads["weight"], res.ref["weight"]

    # The declared algorithm, bit for bit: per id, FP32 sum of its tokens' rows in token order.
    ids = grad_case.inputs["ids"].tolist()
    expect = torch.zeros_like(dw_ref)
    for v in sorted(set(ids)):
        acc = torch.zeros(dw.shape[1], dtype=torch.float32)
        for t, i in enumerate(ids):
            if i == v:
                acc = acc + up[0][t].float().cpu()
        expect[v] = acc.to(expect.device)
    assert bits_equal(dw, expect.to(torch.bfloat16))
    untouched = torch.ones(dw.shape[0], dtype=torch.bool)
    untouched[torch.tensor(sorted(set(ids)))] = False
    assert bits_equal(dw[untouched.to(dw.device)], torch.zeros_like(dw[untouched.to(dw.device)]))
    assert len(set(ids)) < len(ids), "the gradient case must repeat ids"

    # Deterministic: a second run gives the same bits.
    grads2 = gradients(SPEC.impls["triton_cuda_bf16"], grad_case.inputs, SPEC.grad_inputs, up)
    assert bits_equal(dw, grads2["weight"])


@pytest.mark.parametrize("direction", ["forward", "gradient"])
@pytest.mark.parametrize("name", ["batch", "chunk", "padding", "layout"])
def test_invariance_and_negative_control(name, direction, cases, grad_case):
    check_transform(SPEC, name, cases[-1] if direction == "forward" else grad_case, direction)


def test_gradient_batch_compares_duplicated_ids(grad_case):
    pairs = SPEC.transforms["batch"](SPEC.impls["triton_cuda_bf16"], grad_case, "gradient", False)
    ids = grad_case.inputs["ids"].tolist()
    dup = {v for v in ids if ids.count(v) > 1}
    labels = " ".join(p.label for p in pairs)
    assert any(str(v) in labels for v in dup)


def test_tp_is_declared_na():
    assert isinstance(SPEC.transform("tp"), str)


def test_p9_boundary_ids_exact(device):
    v, e = 151936, 8
    weight = randn((v, e), make_generator(SEED), device=device)
    ids = torch.tensor([0, v - 1, 0], dtype=torch.int64, device=device)
    out = embedding(ids, weight)
    assert bits_equal(out, weight[ids])
    empty = embedding(torch.zeros(0, dtype=torch.int64, device=device), weight)
    assert empty.shape == (0, e) and empty.dtype == torch.bfloat16


@pytest.mark.parametrize("bad", [151936, -1, -100, 2**31 - 1])
def test_p9_out_of_range_raises_before_launch(bad, device, monkeypatch):
    v, e = 151936, 8
    weight = randn((v, e), make_generator(SEED), device=device)

    def boom(*args, **kwargs):
        raise AssertionError("kernel launched before validation")

    monkeypatch.setattr(emb_triton, "embedding_fwd", boom)
    ids = torch.tensor([0, bad, 3], dtype=torch.int64, device=device)
    with pytest.raises(InputError, match=str(bad)):
        embedding(ids, weight)


def test_bad_inputs_raise(device):
    weight = randn((10, 16), make_generator(SEED), device=device)
    ids = torch.tensor([1, 2], dtype=torch.int64, device=device)
    with pytest.raises(InputError, match="dtype"):
        embedding(ids.to(torch.int32), weight)
    with pytest.raises(InputError, match="dtype"):
        embedding(ids, weight.float())
    with pytest.raises(InputError, match="dimensions"):
        embedding(ids[None, :], weight)
    with pytest.raises(InputError, match="dimensions"):
        embedding(ids, weight[0])
    with pytest.raises(InputError, match="stride"):
        embedding(ids, weight.t().contiguous().t())
    with pytest.raises(InputError, match="stride"):
        embedding(torch.tensor([1, 0, 2, 0], device=device)[::2], weight)
    with pytest.raises(InputError):
        embedding(ids.tolist(), weight)
