"""Tests of the token embedding (forward exact copies, deterministic segment-sum backward, P9)."""

from __future__ import annotations

import pytest
import torch

from rl_engine.errors import InputError
from rl_engine.ops.embedding import embedding
from rl_engine.ops.embedding import triton as emb_triton
from rl_engine.ops.embedding.spec import SPEC
from rl_engine.ops.execute import make_upstream, run_forward, run_gradient, upcast_inputs
from rl_engine.ops.spec import WORKLOADS, make_generator, randn

SMOKE = WORKLOADS["smoke"]
SEED = 1234
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
    counts = [c.inputs["ids"].shape[0] for c in cases]
    assert 1 in counts and any(t % 2 for t in counts if t > 1)


def test_forward_exact_rows(cases, contract):
    tol = contract.tolerance("forward", contract.op_class("embedding"))
    for case in cases:
        (out,) = run_forward(SPEC.impls["triton_cuda_bf16"], case.inputs)
        (ref,) = run_forward(SPEC.impls["reference_fp32"], upcast_inputs(case.inputs))
        (hf,) = run_forward(SPEC.impls["torch_bf16"], case.inputs)
        assert out.dtype == torch.bfloat16 and out.shape == ref.shape, case.id
        torch.testing.assert_close(out.float(), ref, atol=tol.atol, rtol=tol.rtol, msg=case.id)
        assert torch.equal(out.float(), ref), f"{case.id}: rows are not exact copies"
        assert _bits_equal(out, hf), case.id


def test_backward_segment_sums(grad_case, contract):
    tol = contract.tolerance("gradient", contract.op_class("embedding"))
    impl = SPEC.impls["triton_cuda_bf16"]
    probe = run_forward(impl, grad_case.inputs)
    up = make_upstream(probe, grad_case.seed + 7)
    _, grads, _ = run_gradient(impl, grad_case.inputs, SPEC.grad_inputs, upstream=up)
    _, grads_ref, _ = run_gradient(SPEC.impls["reference_fp32"], upcast_inputs(grad_case.inputs),
                                   SPEC.grad_inputs, upstream=tuple(u.float() for u in up))
    dw, dw_ref = grads["weight"], grads_ref["weight"]
    assert dw.dtype == torch.bfloat16 and dw.shape == grad_case.inputs["weight"].shape
    torch.testing.assert_close(dw.float(), dw_ref, atol=tol.atol, rtol=tol.rtol)

    # The declared algorithm, bit for bit: per id, FP32 sum of its tokens' rows in token order.
    ids = grad_case.inputs["ids"].tolist()
    expect = torch.zeros_like(dw_ref)
    for v in sorted(set(ids)):
        acc = torch.zeros(dw.shape[1], dtype=torch.float32)
        for t, i in enumerate(ids):
            if i == v:
                acc = acc + up[0][t].float().cpu()
        expect[v] = acc.to(expect.device)
    assert _bits_equal(dw, expect.to(torch.bfloat16))
    untouched = torch.ones(dw.shape[0], dtype=torch.bool)
    untouched[torch.tensor(sorted(set(ids)))] = False
    assert _bits_equal(dw[untouched.to(dw.device)], torch.zeros_like(dw[untouched.to(dw.device)]))
    assert len(set(ids)) < len(ids), "the gradient case must repeat ids"

    # Deterministic: a second run gives the same bits.
    _, grads2, _ = run_gradient(impl, grad_case.inputs, SPEC.grad_inputs, upstream=up)
    assert _bits_equal(dw, grads2["weight"])


@pytest.mark.parametrize("direction", ["forward", "gradient"])
@pytest.mark.parametrize("name", ["batch", "chunk", "padding", "layout"])
def test_invariance_and_negative_control(name, direction, cases, grad_case):
    fn = SPEC.transform(name)
    assert callable(fn)
    case = cases[-1] if direction == "forward" else grad_case
    impl = SPEC.impls["triton_cuda_bf16"]
    pairs = fn(impl, case, direction, False)
    assert pairs
    for p in pairs:
        assert _bits_equal(p.canonical, p.transformed), f"{name}/{direction}: {p.label}"
    planted = fn(impl, case, direction, True)
    assert any(not _bits_equal(p.canonical, p.transformed) for p in planted), f"{name}: control passed"


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
    assert _bits_equal(out, weight[ids])
    empty = embedding(torch.zeros(0, dtype=torch.int64, device=device), weight)
    assert empty.shape == (0, e) and empty.dtype == torch.bfloat16


@pytest.mark.parametrize("bad", [151936, -1, -100, 2**31 - 1])
def test_p9_out_of_range_raises_before_launch(bad, device, monkeypatch):
    v, e = 151936, 8
    weight = randn((v, e), make_generator(SEED), device=device)

    def boom(*args, **kwargs):
        raise AssertionError("kernel launched before validation")

    monkeypatch.setattr(emb_triton, "_launch_fwd", boom)
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
