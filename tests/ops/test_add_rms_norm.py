"""The differentiable residual add + RMSNorm (:func:`rl_engine.ops.rms_norm.add_rms_norm_kernel`,
issue #33 "no wasted passes"): ``(s, y)`` and the gradients of x, delta and weight are bitwise the
separate ops' (``torch.add`` then ``rms_norm``, autograd summing the two gradients of ``s``), in
both backward forms, and a Qwen3 training step with it gives the plain step's logprobs and weight
gradients bit for bit. Each comparison has a control that must fail."""

from __future__ import annotations

import pytest
import torch

from _helpers import bits_equal
from rl_engine.backends.registry import availability
from rl_engine.errors import InputError
from rl_engine.ops.rms_norm import add_rms_norm_kernel, rms_norm
from rl_engine.ops.rms_norm import triton as rn
from rl_engine.ops.spec import make_generator, randn

TRITON = "triton_cuda_bf16"
EPS = 1e-6


def _backends():
    return [b for b in (TRITON, "cuda_bf16") if availability(b)[0]]


def _inputs(t, e, device, seed=7):
    g = make_generator(seed + t * 13 + e)
    x = randn((t, e), g, scale=2.0, device=device)
    d = randn((t, e), g, scale=0.5, device=device)
    w = (1 + 0.25 * randn((e,), g, device=device).float()).to(torch.bfloat16)
    ds = randn((t, e), g, device=device)
    dy = randn((t, e), g, device=device)
    return x, d, w, ds, dy


def _grads(outs, leaves, ups):
    pairs = [(o, u) for o, u in zip(outs, ups) if u is not None]
    return torch.autograd.grad([o for o, _ in pairs], leaves, [u for _, u in pairs])


def _fused(x, d, w, ds, dy, order, backend):
    leaves = [t.clone().requires_grad_(True) for t in (x, d, w)]
    s, y = add_rms_norm_kernel(*leaves, EPS, order, backend=backend)
    return (s.detach(), y.detach(), *_grads((s, y), leaves, (ds, dy)))


def _separate(x, d, w, ds, dy, order, backend):
    leaves = [t.clone().requires_grad_(True) for t in (x, d, w)]
    s = leaves[0] + leaves[1]
    y = rms_norm(s, leaves[2], EPS, order, backend=backend)
    return (s.detach(), y.detach(), *_grads((s, y), leaves, (ds, dy)))


NAMES = ("s", "y", "dx", "ddelta", "dweight")


@pytest.mark.parametrize("order", ["hf", "fused"])
@pytest.mark.parametrize("t,e", [(1, 256), (5, 200), (2 * rn.ROWS_PER_PROGRAM + 5, 256)])
def test_same_bits_as_the_separate_ops(t, e, order, device):
    for backend in _backends():
        x, d, w, ds, dy = _inputs(t, e, device)
        got, want = _fused(x, d, w, ds, dy, order, backend), _separate(x, d, w, ds, dy, order, backend)
        for name, a, b in zip(NAMES, got, want):
            assert bits_equal(a, b), f"{backend} {name} differs from the separate ops"


def test_unused_residual_output_adds_nothing(device):
    """The last layer's ``s`` feeds nothing: its gradient is absent, and dx is the norm's alone
    (a materialised zero would turn a -0 dx into +0)."""
    for backend in _backends():
        x, d, w, _, dy = _inputs(5, 256, device)
        dy[0, :4] = 0  # zero upstream in a few columns: dx there can be a signed zero
        got, want = _fused(x, d, w, None, dy, "hf", backend), _separate(x, d, w, None, dy, "hf", backend)
        for name, a, b in zip(NAMES[2:], got[2:], want[2:]):
            assert bits_equal(a, b), f"{backend} {name} differs with s unused"


def test_residual_gradient_is_added_to_the_rounded_dx_in_both_backward_forms(device):
    """Launcher level: the split and the one-kernel backward give the same dx with the residual
    gradient; the dx is ``bf16(bf16(norm dx) + ds)``. Controls: leaving ds out, or adding it
    before the norm's dx is rounded (``bf16(norm dx in FP32 + ds)``, emulated from a second
    launch with ds = 0 in FP32 terms), is caught."""
    t, e = 2 * rn.ROWS_PER_PROGRAM + 5, 256
    x, d, w, ds, dy = _inputs(t, e, device, seed=11)
    s, _, rstd = rn.add_rms_norm_train_fwd(x, d, w, EPS, True)
    one = rn.rms_norm_bwd(s, w, dy, rstd, True, True, split=False, residual_grad=ds)
    split = rn.rms_norm_bwd(s, w, dy, rstd, True, True, split=True, residual_grad=ds)
    plain = rn.rms_norm_bwd(s, w, dy, rstd, True, True, split=True)
    assert bits_equal(one[0], split[0]) and bits_equal(one[1], split[1])
    assert bits_equal(one[0], plain[0] + ds)  # autograd's bf16 sum of the two gradients
    assert bits_equal(one[1], plain[1])  # dweight does not see the residual
    assert not bits_equal(one[0], plain[0])  # control: the residual gradient is there


def test_training_step_with_the_fused_residual_gives_the_plain_bits(device):
    """A one-layer tiny-smoke Qwen3 training step (the decoder stack and final norm, a fixed random linear
    loss on the hidden states instead of the vocabulary head, which the interpreter is slow at;
    backward into every weight) with the fused residual table against the plain table: same
    hidden states, same gradient of every weight. Control: a fused table whose backward drops the
    residual gradient differs."""
    from rl_engine.chain.config import get_config
    from rl_engine.chain.model import Qwen3Model
    from rl_engine.chain.weights import synthetic_weights

    import dataclasses

    # one layer keeps the interpreter's time down and still has both kinds of fused call: the
    # post-attention norm (its s feeds the final norm) and the final norm (its s feeds nothing)
    cfg = dataclasses.replace(get_config("tiny-smoke"), num_hidden_layers=1)
    b, s = 2, 5
    ids = torch.randint(0, cfg.vocab_size, (b * s,), generator=torch.Generator().manual_seed(3)).to(device)
    pos = torch.arange(s, device=device).repeat(b)
    cu = torch.arange(0, b * s + 1, s, dtype=torch.int32, device=device)

    def step(table):
        weights = synthetic_weights(cfg, 0, logit_scale=2.0, device=device)
        params = [t.requires_grad_(True) for _, t in weights.named_tensors()]
        model = Qwen3Model(weights, TRITON)
        ops = table(model)
        hidden = model.forward(ids, pos, cu_seqlens=cu, ops=ops)
        probe = torch.randn(hidden.shape, generator=torch.Generator().manual_seed(5)).to(device)
        grads = torch.autograd.grad((hidden.float() * probe).sum(), params, allow_unused=True)
        return hidden.detach(), grads

    base_h, base_g = step(lambda m: m.ops)
    h, g = step(lambda m: m.training_ops())
    assert bits_equal(h, base_h)
    assert sum(a is not None for a in g) >= 9 * cfg.num_hidden_layers + 2  # every layer weight, embedding, norm
    assert all((a is None and c is None) or bits_equal(a, c) for a, c in zip(g, base_g)), "a weight gradient differs"

    def dropped(x, delta, weight, eps, order):  # NEGATIVE CONTROL: the residual's gradient is lost
        s_, y_ = add_rms_norm_kernel(x, delta, weight, eps, order, backend=TRITON)
        return s_.detach() + (s_ - s_.detach()) * 0, y_

    _, g_bad = step(lambda m: m.training_ops().replace(add_rms_norm=dropped))
    assert not all((a is None and c is None) or bits_equal(a, c) for a, c in zip(g_bad, base_g))


def test_bad_delta_is_refused_before_any_launch(device):
    x, d, w, _, _ = _inputs(3, 64, device)
    with pytest.raises(InputError, match="delta"):
        add_rms_norm_kernel(x, d[:2], w, EPS, backend=TRITON)
    with pytest.raises(InputError, match="delta"):
        add_rms_norm_kernel(x, d.float(), w, EPS, backend=TRITON)
