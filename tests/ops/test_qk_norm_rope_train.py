"""The differentiable QK-norm + RoPE (:func:`rl_engine.ops.qk_norm.op.qk_norm_rope_kernel`, issue #33
"no wasted passes"): the output and the gradients of x and weight are bitwise the separate ops'
(``qk_norm`` then ``rope``, autograd chaining the rotation's backward into the norm's), on both
backends and in both Triton backward forms; the fused forward keeps the norm's ``rstd``. The
training-step comparison of the whole table is ``test_add_rms_norm.py``'s (``training_ops`` has
both fusions). Each comparison has a control that must fail."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from _helpers import bits_equal
from rl_engine.errors import InputError
from rl_engine.ops.qk_norm.op import qk_norm_kernel, qk_norm_rope_kernel
from rl_engine.ops.rms_norm import triton as rn
from rl_engine.ops.rope import cos_sin
from rl_engine.ops.rope.op import rope_kernel
from rl_engine.ops.spec import make_generator, randn
from test_add_rms_norm import TRITON, backend, cuda_context  # noqa: F401  (fixtures)

EPS = 1e-6


def _inputs(t, h, d, device, seed=5):
    g = make_generator(seed + t * 7 + h * 3 + d)
    x = randn((t, h, d), g, scale=2.0, device=device)
    w = (1 + 0.25 * randn((d,), g, device=device).float()).to(torch.bfloat16)
    dy = randn((t, h, d), g, device=device)
    cos, sin = cos_sin(torch.arange(t, device=device) * 37 + 11, 1_000_000.0, d)
    return x, w, dy, cos.to(device), sin.to(device)


def _run(fn, x, w, dy):
    leaves = [x.clone().requires_grad_(True), w.clone().requires_grad_(True)]
    y = fn(*leaves)
    return (y.detach(), *torch.autograd.grad(y, leaves, dy))


def _device(name, device):
    return device if name == TRITON else (torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu"))


NAMES = ("y", "dx", "dweight")


@pytest.mark.parametrize("one_kernel", [False, True])
@pytest.mark.parametrize("t,h,d,order", [(0, 4, 128, "hf"), (1, 3, 128, "fused"), (5, 2, 64, "hf"),
                                         (3, 3, 256, "fused"), (rn.ROWS_PER_PROGRAM + 3, 2, 128, "hf")])
def test_same_bits_as_the_separate_ops(t, h, d, order, one_kernel, backend, device, monkeypatch):
    """Both rounding orders, an empty batch, D = 64, 128 and 256 (cuda_bf16's rows form with one and
    two columns per virtual thread), and more rows than two dweight chunks
    (134 head rows: a partial third chunk, and a partial last tile of the rows kernels; the
    interpreter is slow: each shape runs with one order)."""
    name, ctx = backend
    if one_kernel:
        if name != TRITON:
            pytest.skip("cuda_bf16 has one backward form")
        monkeypatch.setattr(rn, "SPLIT_BELOW_PROGRAMS", 1)
        monkeypatch.setattr(rn, "ROWS_FORM_MAX_BLOCK", 0)  # the rows form is the default for heads
    with ctx():
        x, w, dy, cos, sin = _inputs(t, h, d, _device(name, device))
        got = _run(lambda a, b: qk_norm_rope_kernel(a, b, EPS, order, cos, sin, backend=name), x, w, dy)
        want = _run(lambda a, b: rope_kernel(qk_norm_kernel(a, b, EPS, order, backend=name), cos, sin, backend=name),
                    x, w, dy)
    for n, a, b in zip(NAMES, got, want):
        assert bits_equal(a, b), f"{name} {n} differs from the separate ops"


def test_rotation_sign_and_rounding_are_caught(device):
    """NEGATIVE CONTROLS at the launcher: the fused backward fed the rotation by +sin instead of
    -sin, or the unrotated gradient, gives other dx and dweight bits than the separate ops."""
    x, w, dy, cos, sin = _inputs(rn.ROWS_PER_PROGRAM + 3, 2, 128, device, seed=9)
    y, rstd = rn.norm_rope_train_fwd(x, w, cos, sin, EPS, True)
    ref_y, ref_rstd = rn.rms_norm_fwd(x, w, EPS, True)
    assert bits_equal(rstd, ref_rstd)  # the fused forward keeps the norm's rstd
    from rl_engine.ops.rope import triton as rt

    assert bits_equal(y, rt.rope_rotate(ref_y, cos, sin, False))
    fused = rn.rms_norm_bwd(x, w, dy, rstd, True, True, rope=(cos, sin))
    sep = rn.rms_norm_bwd(x, w, rt.rope_rotate(dy, cos, sin, True), rstd, True, True)
    assert bits_equal(fused[0], sep[0]) and bits_equal(fused[1], sep[1])
    for split, rows in ((True, False), (False, False)):  # the split dx kernel and the fused kernel, with RoPE
        form = rn.rms_norm_bwd(x, w, dy, rstd, True, True, rope=(cos, sin), split=split, rows=rows)
        assert bits_equal(form[0], sep[0]) and bits_equal(form[1], sep[1]), (split, rows)
    wrong_sign = rn.rms_norm_bwd(x, w, dy, rstd, True, True, rope=(cos, -sin), split=True, rows=False)
    unrotated = rn.rms_norm_bwd(x, w, dy, rstd, True, True)
    for bad in (wrong_sign, unrotated):
        assert not bits_equal(bad[0], sep[0]) and not bits_equal(bad[1], sep[1])


def test_bad_inputs_are_refused_before_any_launch(device):
    x, w, _, cos, sin = _inputs(3, 2, 128, device)
    with pytest.raises(InputError, match="cos"):
        qk_norm_rope_kernel(x, w, EPS, "hf", cos[:2], sin, backend=TRITON)
    with pytest.raises(InputError, match="sin"):
        qk_norm_rope_kernel(x, w, EPS, "hf", cos, sin.double(), backend=TRITON)
    with pytest.raises(InputError, match="power of two"):
        x6, w6, _, c6, s6 = _inputs(3, 2, 12, device)
        qk_norm_rope_kernel(x6, w6, EPS, "hf", c6, s6, backend=TRITON)
    with pytest.raises(InputError, match="eps"):
        qk_norm_rope_kernel(x, w, None, "hf", cos, sin, backend=TRITON)
    with pytest.raises(InputError, match="power of two"):  # D = 0: refused, not a failed launch
        qk_norm_rope_kernel(x[..., :0], w[:0], EPS, "hf", cos[:, :0], sin[:, :0], backend=TRITON)
    with pytest.raises(ValueError, match="rope tables"):
        rn.rms_norm_bwd(x.reshape(3, 256), w, x.reshape(3, 256), torch.ones(3, device=device), True, True,
                        rope=(cos, sin))


def test_training_table_refuses_a_cache_and_checks_k_before_launching_q(monkeypatch):
    """``training_ops``'s QK-norm + RoPE writes no KV cache: asked to, it says so (rollout uses
    ``decode_ops``). A bad k weight is refused before q's kernel runs (the launch is counted;
    control: good inputs launch twice)."""
    from rl_engine.chain.config import get_config
    from rl_engine.chain.model import Qwen3Model
    from rl_engine.chain.weights import synthetic_weights

    dev = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    model = Qwen3Model(synthetic_weights(get_config("tiny-smoke"), 0, device=dev), TRITON)
    f = model.training_ops()
    x, w, _, cos, sin = _inputs(2, 2, 64, dev)
    with pytest.raises(InputError, match="KV cache"):
        f("qk_norm_rope", "qk_norm_rope", q=x, k=x, v=x, q_weight=w, k_weight=w, eps=EPS, order="hf", cos=cos,
          sin=sin, k_cache=x)
    import rl_engine.ops.qk_norm.op as qk

    launches = []
    real = qk.norm_rope_rows
    monkeypatch.setattr(qk, "norm_rope_rows", lambda *a, **kw: launches.append(1) or real(*a, **kw))
    with pytest.raises(InputError, match="weight"):
        f("qk_norm_rope", "qk_norm_rope", q=x, k=x, v=x, q_weight=w, k_weight=w.float(), eps=EPS, order="hf",
          cos=cos, sin=sin)
    assert launches == []
    f("qk_norm_rope", "qk_norm_rope", q=x, k=x, v=x, q_weight=w, k_weight=w, eps=EPS, order="hf", cos=cos, sin=sin)
    assert len(launches) == 2


def test_cuda_bf16_fusions_are_one_launch_each_way(cuda_context, monkeypatch):
    """cuda_bf16 runs the training fusions as the Triton backend does (the bits are the other
    tests'): the add + RMSNorm forward and the QK-norm + RoPE forward are one launch each, their
    backward the norm's dx and dweight launches with no ``torch.add`` or ``rl_rope`` between.
    A head longer than the one-launch kernel takes (D = 512) runs the separate launches, with the
    separate ops' bits."""
    from rl_engine.ops.rms_norm import add_rms_norm_kernel
    from rl_engine.ops.rms_norm import cuda as rc
    from rl_engine.ops.rope import cuda as ropec

    names = []

    def recording(real):
        def wrapped(device, name, *args):
            names.append(name)
            return real(device, name, *args)
        return wrapped

    monkeypatch.setattr(rc, "launch", recording(rc.launch))
    monkeypatch.setattr(ropec, "launch", recording(ropec.launch))
    dev = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    with cuda_context():
        x, w, dy, cos, sin = _inputs(3, 2, 128, dev)
        _run(lambda a, b: qk_norm_rope_kernel(a, b, EPS, "hf", cos, sin, backend="cuda_bf16"), x, w, dy)
        assert names == ["rl_norm_rope_fwd", "rl_rms_norm_bwd_dx", "rl_rms_norm_bwd_dw"], names
        names.clear()
        e = 256
        xs, d, ws, ds = (randn((3, e), make_generator(3), device=dev), randn((3, e), make_generator(4), device=dev),
                         (1 + 0.25 * randn((e,), make_generator(5), device=dev).float()).to(torch.bfloat16),
                         randn((3, e), make_generator(6), device=dev))
        leaves = [t.clone().requires_grad_(True) for t in (xs, d, ws)]
        s, y = add_rms_norm_kernel(*leaves, EPS, "hf", backend="cuda_bf16")
        torch.autograd.grad((s, y), leaves, (ds, ds))
        assert names == ["rl_add_rms_norm_fwd", "rl_rms_norm_bwd_dx", "rl_rms_norm_bwd_dw"], names
        names.clear()
        x, w, dy, cos, sin = _inputs(2, 1, 2 * rc.NORM_ROPE_MAX_D, dev)
        got = _run(lambda a, b: qk_norm_rope_kernel(a, b, EPS, "hf", cos, sin, backend="cuda_bf16"), x, w, dy)
        assert names[:2] == ["rl_rms_norm_fwd", "rl_rope"], names
        want = _run(lambda a, b: rope_kernel(qk_norm_kernel(a, b, EPS, "hf", backend="cuda_bf16"), cos, sin,
                                             backend="cuda_bf16"), x, w, dy)
    for n, a, b in zip(NAMES, got, want):
        assert bits_equal(a, b), f"D = {2 * rc.NORM_ROPE_MAX_D}: {n} differs from the separate ops"


@pytest.mark.parametrize("d", [128, 256])
def test_cuda_bf16_rows_form_adds_the_warp_sums_in_the_block_order(cuda_context, d):
    """cuda_bf16's rows form (a warp per head row, its lanes playing the block's four warps) must
    add the four warp sums as the block form and the Triton kernels do, ``(w0 + w1) + (w2 + w3)``.
    Rows built so that the order decides the result, the terms in lane 5 (and 6) of each virtual
    warp (for D = 256 in the second column of its virtual threads): the backward's dot has warp
    sums 2^24, -2^24, 1, 1 (that order: 2; (w0 + w2) + (w1 + w3): 1), the forward's sum of squares
    6144^2, 0, 2, 2 (that order: 6144^2 + 4; the other: 6144^2, each 2 absorbed, ties to even).
    The results are compared with the Triton launchers' (the spec both follow) and with the value
    each order gives (control: the other order's value differs). Six rows: a partial second
    block of four."""
    from rl_engine.ops.rms_norm import cuda as rc

    t, h = 3, 2
    m = d // 128 - 1

    def col(j, lane):  # column of virtual warp j, lane, second index m
        return 32 * j + lane + 128 * m

    big, sq = 2.0 ** 12, 6144.0
    dev = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    w = torch.ones(d, dtype=torch.bfloat16, device=dev)
    xf, xb, dy = (torch.zeros((t, h, d), dtype=torch.bfloat16, device=dev) for _ in range(3))
    xf[:, :, col(0, 5)] = sq
    for j in (2, 3):
        xf[:, :, col(j, 5)] = 1.0
        xf[:, :, col(j, 6)] = 1.0
    for j, xv, g in zip(range(4), (big, big, 1.0, 1.0), (big, -big, 1.0, 1.0)):
        xb[:, :, col(j, 5)] = xv
        dy[:, :, col(j, 5)] = g
    rstd = torch.ones(t * h, dtype=torch.float32, device=dev)
    cos, sin = (a.to(dev) for a in cos_sin(torch.arange(t) * 5 + 1, 1_000_000.0, d))
    ref_y, ref_rstd = rn.rms_norm_fwd(xf, w, EPS, True)  # Triton: on the GPU, else its interpreter
    ref_dx, _ = rn.rms_norm_bwd(xb, w, dy, rstd, True, True, split=True)
    with cuda_context():
        _, got_rstd = rc.norm_rope_train_fwd(xf, w, cos, sin, EPS, True)
        got_dx, _ = rc.rms_norm_bwd(xb, w, dy, rstd, True, False)
    ref_rstd, ref_dx, got_rstd, got_dx = (a.cpu() for a in (ref_rstd, ref_dx, got_rstd, got_dx))

    def r_of(total):
        # the kernels' 1 / sqrt(sum / n + eps) in FP32 with IEEE sqrt and division (-prec-sqrt=true,
        # -prec-div=true): NumPy's float32 scalars round each step so on every host; torch's CPU sqrt
        # does not (on an AMD EPYC host with AVX2 it returned 384.0 for sqrt(147456.015625), whose
        # nearest float is 384.0000305), which once made this expected value depend on the host
        f32 = np.float32
        return torch.tensor(f32(1.0) / np.sqrt(f32(total) / f32(d) + f32(EPS)), dtype=torch.float32)

    assert bits_equal(got_rstd, ref_rstd), "the forward's rows form differs from the Triton kernel's rstd"
    assert bool((got_rstd == r_of(sq * sq + 4)).all()) and bool(r_of(sq * sq) != r_of(sq * sq + 4))
    assert bits_equal(got_dx, ref_dx), "the backward's rows form differs from the Triton kernel's dx"
    dx_at = got_dx[:, :, col(2, 5)].float()  # 1 - 1 * k with k = (dot / D) * r^2, r = 1
    want, other = torch.tensor(1 - 2 / d).to(torch.bfloat16).float(), torch.tensor(1 - 1 / d).to(torch.bfloat16).float()
    assert bool((dx_at == want).all()) and bool(want != other)


def test_both_launchers_refuse_bad_fused_extras():
    """Both backends' norm-backward launchers refuse a residual gradient for head rows or of
    another shape, and RoPE tables for [T, E] rows, of another shape or not FP32, before any launch
    (ValueError: the op layer checks its inputs first; this guards direct calls)."""
    from rl_engine.ops.rms_norm import cuda as rc

    w = torch.ones(8, dtype=torch.bfloat16)
    x2, x3 = torch.zeros((4, 8), dtype=torch.bfloat16), torch.zeros((4, 2, 8), dtype=torch.bfloat16)
    rstd = torch.ones(8, dtype=torch.float32)
    good = (torch.ones((4, 4), dtype=torch.float32), torch.zeros((4, 4), dtype=torch.float32))
    for mod in (rn, rc):
        with pytest.raises(ValueError, match="residual_grad"):
            mod.rms_norm_bwd(x3, w, x3, rstd, True, True, residual_grad=x3)
        with pytest.raises(ValueError, match="residual_grad"):
            mod.rms_norm_bwd(x2, w, x2, rstd, True, True, residual_grad=x2[:3])
        with pytest.raises(ValueError, match="rope tables"):
            mod.rms_norm_bwd(x2, w, x2, rstd, True, True, rope=good)
        with pytest.raises(ValueError, match="rope tables"):
            mod.rms_norm_bwd(x3, w, x3, rstd, True, True, rope=(good[0].double(), good[1]))
        with pytest.raises(ValueError, match="rope tables"):
            mod.rms_norm_bwd(x3, w, x3, rstd, True, True, rope=(good[0][:3], good[1][:3]))


@pytest.mark.parametrize("t,h,d", [(3, 2, 32), (5, 2, 64), (2, 3, 128), (3, 2, 256)])
def test_cuda_rotation_in_registers_and_through_shared_memory_agree(t, h, d, cuda_context):
    """``rl_norm_rope_fwd``'s two ways to rotate (``set_norm_rope_in_lane``: in registers for heads
    of 64, 128 and 256 columns, through shared memory otherwise and when asked) give the bits of the
    norm's launch then ``rl_rope``'s, with the norm's rstd; D = 32 always takes shared memory (its
    partner columns sit in other lanes). Control: the same launch with the sine negated differs."""
    from rl_engine.ops.rms_norm import cuda as rc
    from rl_engine.ops.rope.cuda import rope_rotate

    with cuda_context():
        dev = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
        x, w, _, cos, sin = _inputs(t, h, d, dev, seed=11)
        ref_y, ref_rstd = rc.rms_norm_fwd(x, w, EPS, True)
        want = rope_rotate(ref_y, cos, sin, False)
        for on in (1, 0):
            before = rc.set_norm_rope_in_lane(on)
            try:
                y, rstd = rc.norm_rope_train_fwd(x, w, cos, sin, EPS, True)
                bad, _ = rc.norm_rope_train_fwd(x, w, cos, -sin, EPS, True)
            finally:
                rc.set_norm_rope_in_lane(before)
            assert bits_equal(y, want) and bits_equal(rstd, ref_rstd), f"in lane {on}"
            assert not bits_equal(bad, want), f"in lane {on}: the negated sine gave the same bits"
    with pytest.raises(InputError, match="0 or 1"):
        rc.set_norm_rope_in_lane(2)
