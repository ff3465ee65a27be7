"""Tests of RMSNorm: accuracy, both rounding orders bit for bit (P2), eps from the caller (P12),
deterministic dweight, invariance with planted and size-dependent negative controls."""

from __future__ import annotations

import inspect

import pytest
import torch

from _helpers import (SMOKE, assert_one_and_odd_token_counts, bits_equal, case_fixtures, check_backward_accuracy,
                      check_forward_accuracy, check_transform, control_caught, differing, gradients)
from rl_engine.errors import InputError
from rl_engine.ops.execute import make_upstream, run_forward
from rl_engine.ops.rms_norm import rms_norm
from rl_engine.ops.rms_norm import api as rms_api
from rl_engine.ops.rms_norm.spec import SPEC, norm_weight
from rl_engine.ops.rms_norm.triton import ROWS_PER_PROGRAM
from rl_engine.ops.spec import make_generator, randn

SEED = 4242
KERNEL = SPEC.impls["triton_cuda_bf16"]
P2_BITS = {"hf": (0x3F92, 0x4012), "fused": (0x3F91, 0x4011)}
cases, grad_case = case_fixtures(SPEC, SEED)


def test_cases_cover_shapes_and_orders(cases):
    assert_one_and_odd_token_counts([c.inputs["x"].shape[0] for c in cases])
    assert {c.inputs["order"] for c in cases} == {"hf", "fused"}


def test_forward_accuracy(cases, contract):
    for case in cases:
        check_forward_accuracy(SPEC, case, contract)


@pytest.mark.parametrize("t", [None, 2 * ROWS_PER_PROGRAM + 5])
def test_backward_accuracy_and_determinism(t, grad_case, contract, device):
    case = grad_case
    if t is not None:  # several dweight partial chunks
        g = make_generator(SEED + 5)
        x = randn((t, SMOKE.hidden), g, scale=2.0, device=device)
        case = type(grad_case)(id=f"T{t}", seed=SEED + 5, inputs={**grad_case.inputs, "x": x})
    res = check_backward_accuracy(SPEC, case, contract, relative=True)
    g2 = gradients(KERNEL, case.inputs, SPEC.grad_inputs, res.upstream)
    assert bits_equal(res.grads["x"], g2["x"]) and bits_equal(res.grads["weight"], g2["weight"])


def test_backward_same_formula_for_both_orders(grad_case):
    up = make_upstream(run_forward(KERNEL, grad_case.inputs), grad_case.seed + 7)
    fused = {**grad_case.inputs, "order": "fused"}
    g_hf, g_fused = (gradients(KERNEL, inputs, SPEC.grad_inputs, up) for inputs in (grad_case.inputs, fused))
    assert bits_equal(g_hf["x"], g_fused["x"]) and bits_equal(g_hf["weight"], g_fused["weight"])


@pytest.mark.parametrize("direction", ["forward", "gradient"])
@pytest.mark.parametrize("name", ["batch", "chunk", "padding", "layout"])
def test_invariance_and_negative_control(name, direction, cases, grad_case):
    check_transform(SPEC, name, cases[2] if direction == "forward" else grad_case, direction)


def test_tp_is_declared_na():
    assert isinstance(SPEC.transform("tp"), str)


@pytest.mark.parametrize("direction", ["forward", "gradient"])
def test_size_dependent_control_is_caught(direction, cases, grad_case):
    """A variant whose row reduction is split (BF16 partials) when T < 4 really changes bits."""
    control = SPEC.controls["batch"]
    case = cases[2] if direction == "forward" else grad_case
    assert control_caught(SPEC.transforms["batch"](control, case, direction, False))
    # The same check passes for the real kernel on the same case (no plant).
    assert not differing(SPEC.transforms["batch"](KERNEL, case, direction, False))


@pytest.mark.parametrize("t", [1, 5])
@pytest.mark.parametrize("backend", ["triton_cuda_bf16", "torch_bf16"])
@pytest.mark.parametrize("order", ["hf", "fused"])
def test_p2_rounding_order_bits(order, backend, t, device):
    x = torch.tensor([1.0, 1.0, 1.0, 2.0] * 32, dtype=torch.bfloat16, device=device).repeat(t, 1)
    w = torch.full((128,), 1.5, dtype=torch.bfloat16, device=device)
    y = rms_norm(x, w, 1e-6, order, backend=backend)
    lo, hi = P2_BITS[order]
    expect = torch.tensor([lo, lo, lo, hi] * 32, dtype=torch.int32).to(torch.int16).repeat(t, 1)
    assert torch.equal(y.view(torch.int16).cpu(), expect)


@pytest.mark.parametrize("eps,expected", [(1e-6, 0.94887), (1e-5, 0.68897)])
def test_p12_eps_from_caller(eps, expected, contract, device):
    tol32 = contract.tolerance("forward", "reduction", "float32")
    x = torch.full((1, 4), 0.003, dtype=torch.bfloat16, device=device)
    w = torch.ones(4, dtype=torch.bfloat16, device=device)
    ref = rms_norm(x.float(), w.float(), eps, backend="reference_fp32")
    torch.testing.assert_close(ref.cpu(), torch.full((1, 4), expected), atol=tol32.atol, rtol=tol32.rtol)
    for backend in ("triton_cuda_bf16", "torch_bf16"):
        y = rms_norm(x, w, eps, backend=backend)
        assert bits_equal(y.cpu(), torch.full((1, 4), expected).to(torch.bfloat16)), backend


def test_p12_eps_has_no_default(device):
    for fn in (rms_api.rms_norm, *SPEC.impls.values(), SPEC.controls["batch"]):
        assert inspect.signature(fn).parameters["eps"].default is inspect.Parameter.empty, fn
    x = torch.ones((1, 4), dtype=torch.bfloat16, device=device)
    with pytest.raises(TypeError):
        rms_norm(x, torch.ones(4, dtype=torch.bfloat16, device=device))  # type: ignore[call-arg]


def test_empty_rows(device):
    x = torch.zeros((0, 8), dtype=torch.bfloat16, device=device)
    w = norm_weight(8, make_generator(SEED), device)
    assert rms_norm(x, w, 1e-6).shape == (0, 8)


def test_bad_inputs_raise(device):
    g = make_generator(SEED)
    x = randn((3, 8), g, device=device)
    w = norm_weight(8, g, device)
    with pytest.raises(InputError, match="dtype"):
        rms_norm(x.float(), w, 1e-6)
    with pytest.raises(InputError, match="dtype"):
        rms_norm(x, w.float(), 1e-6)
    with pytest.raises(InputError, match="shape"):
        rms_norm(x, w[:4], 1e-6)
    with pytest.raises(InputError, match="dimensions"):
        rms_norm(x[None], w, 1e-6)
    with pytest.raises(InputError, match="stride"):
        rms_norm(x.t().contiguous().t(), w, 1e-6)
    with pytest.raises(InputError, match="stride"):
        rms_norm(x, torch.cat([w, w])[::2], 1e-6)
    for bad_eps in (None, -1e-6, float("nan"), True, "1e-6"):
        with pytest.raises(InputError, match="eps"):
            rms_norm(x, w, bad_eps)
    with pytest.raises(InputError, match="order"):
        rms_norm(x, w, 1e-6, "HF")


@pytest.mark.parametrize("shape", [(2 * ROWS_PER_PROGRAM + 5, 320), (40, 4, 128)], ids=["rows", "heads"])
def test_split_backward_equals_fused_backward(shape, device):
    """The split backward (one program per row for dx, per 64-row chunk and column block for the
    dweight partials; chosen when the fused form would have few programs) and the rows form (dx
    of several rows per program, the default for narrow rows) give the fused form's
    dx and dweight bits, with a partial last chunk, for [T, E] and [T, H, D] rows; asked for one
    gradient it computes that one only. Control: the tokens in reverse order keep dx (per row) but
    change dweight's sum order; tokens 0 and 1 are a cancelling pair of 2^30-sized contributions
    (same x, opposite dy), which cancel exactly in order and swallow the small rows summed before
    them in reverse, so the dweight comparison can fail."""
    from rl_engine.ops.rms_norm import triton as rn

    g = torch.Generator().manual_seed(sum(shape))
    x = torch.randn(shape, generator=g).to(torch.bfloat16)
    dy = torch.randn(shape, generator=g).to(torch.bfloat16)
    x[1] = x[0]
    dy[0] = dy[0] * 2.0 ** 30  # a power of two: exact in BF16
    dy[1] = -dy[0]
    x, dy = x.to(device), dy.to(device)
    w = (1 + 0.1 * torch.randn(shape[-1], generator=g)).to(torch.bfloat16).to(device)
    _, rstd = rn.rms_norm_fwd(x, w, 1e-6, True)
    fused = rn.rms_norm_bwd(x, w, dy, rstd, True, True, split=False)
    split = rn.rms_norm_bwd(x, w, dy, rstd, True, True, split=True)
    assert bits_equal(split[0], fused[0]) and bits_equal(split[1], fused[1])
    rows = rn.rms_norm_bwd(x, w, dy, rstd, True, True, rows=True)  # several rows per dx program
    assert bits_equal(rows[0], fused[0]) and bits_equal(rows[1], fused[1])
    with pytest.raises(ValueError, match="two different forms"):  # contradicting flags, before any launch
        rn.rms_norm_bwd(x, w, dy, rstd, True, True, split=False, rows=True)
    with pytest.raises(ValueError, match="residual_grad"):  # refused even for an empty batch
        rn.rms_norm_bwd(x[:0], w, dy[:0], rstd[:0], True, True, rows=True, residual_grad=dy[:0])
    assert bits_equal(rn.rms_norm_bwd(x, w, dy, rstd, True, False, split=True)[0], fused[0])
    assert bits_equal(rn.rms_norm_bwd(x, w, dy, rstd, False, True, split=True)[1], fused[1])
    flipped = rn.rms_norm_bwd(x.flip(0), w, dy.flip(0), rstd.view(shape[0], -1).flip(0).reshape(-1), True, True,
                              split=True)
    assert bits_equal(flipped[0].flip(0), fused[0])
    assert not bits_equal(flipped[1], fused[1])
    # dx is order-sensitive on this input too: row 2 holds +2^30 and -2^30 products in the columns
    # that one lane adds first and second (0 and LANES: same x and weight, opposite dy), so in
    # order they cancel exactly and the
    # lane's later columns survive; the same row with its first and last lane column swapped adds
    # them last, the survivors are swallowed, and dx (through the row sum) gets other bits.
    # So a form whose lane or chunk order differed from the fused form's would fail above.
    width = shape[-1]
    if width > 2 * rn.LANES:
        xo, dyo, wo = x.clone(), dy.clone(), w.clone()
        wo[rn.LANES] = wo[0]
        xo[2, ..., rn.LANES] = xo[2, ..., 0]
        dyo[2, ..., 0] = 2.0 ** 30
        dyo[2, ..., rn.LANES] = -(2.0 ** 30)
        dyo[2, ..., 2 * rn.LANES] = 3.0
        xo[2, ..., 2 * rn.LANES] = 1.0
        rstd_o = rn.rms_norm_fwd(xo, wo, 1e-6, True)[1]
        base = rn.rms_norm_bwd(xo, wo, dyo, rstd_o, True, True, split=False)
        for form in (dict(split=True), dict(rows=True)):
            got = rn.rms_norm_bwd(xo, wo, dyo, rstd_o, True, True, **form)
            assert bits_equal(got[0], base[0]), form
        perm = torch.arange(width, device=device)
        perm[0], perm[2 * rn.LANES] = 2 * rn.LANES, 0
        xs, dys = xo.clone(), dyo.clone()
        xs[2], dys[2] = xo[2][..., perm], dyo[2][..., perm]
        ws = wo[perm]
        swapped = rn.rms_norm_bwd(xs, ws, dys, rn.rms_norm_fwd(xs, ws, 1e-6, True)[1], True, True, split=False)
        assert not bits_equal(swapped[0][2][..., perm], base[0][2])
    import inspect

    # the form is chosen from the row count when not forced
    assert inspect.signature(rn.rms_norm_bwd).parameters["split"].default is None


@pytest.mark.parametrize("n_parts,cols", [(2048, 128), (37, 300), (7, 128), (0, 64)])
def test_dweight_reduce_adds_rows_in_order(n_parts, cols, device):
    """The dweight stage-2 kernel adds the partial rows of each column in FP32 in increasing row
    order (the declared dweight tree's last level): bit for bit the sequential sum, with the
    launch's own columns per program and with 256 and 16 (a launch setting). Control: the rows in
    reverse order give other bits (column 0 holds 2^24, ones, then -2^24: in order the ones
    vanish, reversed they count)."""
    from rl_engine.ops.rms_norm import triton as rt

    g = make_generator(n_parts * 7 + cols)
    parts = randn((n_parts, cols), g) * torch.exp(4 * randn((n_parts, cols), g))
    if n_parts >= 3:
        parts[0, 0], parts[1:-1, 0], parts[-1, 0] = 2.0 ** 24, 1.0, -(2.0 ** 24)
    parts = parts.to(device)

    def reduce(p: torch.Tensor, block: int | None = None) -> torch.Tensor:
        return rt.dw_reduce(p, torch.empty(cols, dtype=torch.bfloat16, device=device), block)

    seq = torch.zeros(cols, dtype=torch.float32, device=device)
    for p in range(n_parts):
        seq = seq + parts[p]
    for block in (None, 256, 16):
        assert bits_equal(reduce(parts, block), seq.to(torch.bfloat16)), block
    if n_parts >= 3:
        assert not bits_equal(reduce(parts.flip(0).contiguous()), seq.to(torch.bfloat16))
    with pytest.raises(ValueError, match="power of two"):
        reduce(parts, 48)
