"""The differentiable QK-norm + RoPE (:func:`rl_engine.ops.qk_norm.op.qk_norm_rope_kernel`, issue #33
"no wasted passes"): the output and the gradients of x and weight are bitwise the separate ops'
(``qk_norm`` then ``rope``, autograd chaining the rotation's backward into the norm's), on both
backends and in both Triton backward forms; the fused forward keeps the norm's ``rstd``. The
training-step comparison of the whole table is ``test_add_rms_norm.py``'s (``training_ops`` has
both fusions). Each comparison has a control that must fail."""

from __future__ import annotations

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
                                         (rn.ROWS_PER_PROGRAM + 3, 2, 128, "hf")])
def test_same_bits_as_the_separate_ops(t, h, d, order, one_kernel, backend, device, monkeypatch):
    """Both rounding orders, an empty batch, D = 64 and 128, and more rows than two dweight chunks
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
