"""The differentiable residual add + RMSNorm (:func:`rl_engine.ops.rms_norm.add_rms_norm_kernel`,
issue #33 "no wasted passes"): ``(s, y)`` and the gradients of x, delta and weight are bitwise the
separate ops' (``torch.add`` then ``rms_norm``, autograd summing the two gradients of ``s``), in
both backward forms, and a Qwen3 training step with it gives the plain step's logprobs and weight
gradients bit for bit. Each comparison has a control that must fail."""

from __future__ import annotations

import shutil
from contextlib import nullcontext
from pathlib import Path

import pytest
import torch

from _helpers import bits_equal
from rl_engine import env
from rl_engine.backends.registry import availability
from rl_engine.errors import InputError
from rl_engine.ops.rms_norm import add_rms_norm_kernel
from rl_engine.ops.rms_norm.op import rms_norm_kernel
from rl_engine.ops.rms_norm import triton as rn
from rl_engine.ops.spec import make_generator, randn

TRITON = "triton_cuda_bf16"
EPS = 1e-6


@pytest.fixture(scope="module")
def cuda_context():
    """How ``cuda_bf16`` runs here: on the GPU, else the host emulation of its CUDA sources (the
    same kernels compiled for the CPU, ``tests/cuda_emu``); skips without either."""
    if availability("cuda_bf16")[0]:
        return nullcontext
    if torch.cuda.is_available() or shutil.which("g++") is None:
        pytest.skip("cuda_bf16 runs neither on a GPU nor in the host emulation here")
    import sys

    tests_dir = str(Path(__file__).resolve().parents[1])
    if tests_dir not in sys.path:
        sys.path.insert(0, tests_dir)
    from cuda_emu.build import build
    from rl_engine.backends.cuda_build import BuildResult, CudaLibrary
    from rl_engine.backends.cuda_launch import host_emulation

    try:
        lib = CudaLibrary(BuildResult(build(env.cache_dir() / "cuda_emu"), "host-emulation", True, 0.0))
    except FileNotFoundError as exc:
        pytest.skip(f"host emulation unavailable: {exc}")
    return lambda: host_emulation(lib)


@pytest.fixture(params=[TRITON, "cuda_bf16"])
def backend(request):
    """``(backend, context manager factory)``: Triton where it runs, cuda_bf16 on the GPU or emulated."""
    if request.param == TRITON:
        ok, why = availability(TRITON)
        if not ok:
            pytest.skip(why)
        return TRITON, nullcontext
    return "cuda_bf16", request.getfixturevalue("cuda_context")


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
    y = rms_norm_kernel(s, leaves[2], EPS, order, backend=backend)  # the op itself: no registry (emulation)
    return (s.detach(), y.detach(), *_grads((s, y), leaves, (ds, dy)))


NAMES = ("s", "y", "dx", "ddelta", "dweight")


@pytest.mark.parametrize("one_kernel", [False, True])
@pytest.mark.parametrize("order", ["hf", "fused"])
@pytest.mark.parametrize("t,e", [(0, 64), (1, 256), (5, 200), (3, 264), (2 * rn.ROWS_PER_PROGRAM + 5, 256)])
def test_same_bits_as_the_separate_ops(t, e, order, one_kernel, backend, device, monkeypatch):
    """Both backward forms of the Triton norm (``one_kernel``: the dx-and-dweight kernel, which
    the row count chooses from 264 x 64 rows on; forced here); cuda_bf16 has one form per row
    length (E <= 256: a warp per row; E = 264: a block per row)."""
    name, ctx = backend
    if one_kernel:
        if name != TRITON:
            pytest.skip("cuda_bf16 has one backward form")
        monkeypatch.setattr(rn, "SPLIT_BELOW_PROGRAMS", 1)
    dev = device if name == TRITON else (torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu"))
    with ctx():
        x, d, w, ds, dy = _inputs(t, e, dev)
        got, want = _fused(x, d, w, ds, dy, order, name), _separate(x, d, w, ds, dy, order, name)
    for n, a, b in zip(NAMES, got, want):
        assert bits_equal(a, b), f"{name} {n} differs from the separate ops"


def test_unused_residual_output_adds_nothing(backend, device):
    """The last layer's ``s`` feeds nothing: its gradient is absent and dx is the norm's alone.
    A row whose upstream is -0 with positive x and weight gives -0 in dx, so a materialised zero
    residual gradient (+0 added: -0 + +0 = +0) would change bits. Control: passing that zero
    explicitly is caught."""
    name, ctx = backend
    dev = device if name == TRITON else (torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu"))
    with ctx():
        x, d, w, _, dy = _inputs(5, 256, dev)
        x, d, w = x.abs(), torch.zeros_like(d), w.abs()  # s = x > 0
        dy[0] = -0.0
        got, want = _fused(x, d, w, None, dy, "hf", name), _separate(x, d, w, None, dy, "hf", name)
        zeros = _fused(x, d, w, torch.zeros_like(dy), dy, "hf", name)
    assert bool(torch.signbit(want[2][0]).any()), "the case has no -0 in dx: it cannot catch a materialised zero"
    for n, a, b in zip(NAMES[2:], got[2:], want[2:]):
        assert bits_equal(a, b), f"{name} {n} differs with s unused"
    assert not bits_equal(zeros[2], want[2])  # control


def test_residual_gradient_is_added_to_the_rounded_dx_in_both_backward_forms(device):
    """Launcher level: the split and the one-kernel backward give the same dx with the residual
    gradient, and that dx is ``bf16(bf16(norm dx) + ds)`` (the norm's own dx plus ds, as a BF16
    torch add). Control: leaving ds out is caught."""
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
    backward into every weight) with the training table (fused residual + norm, fused QK-norm +
    RoPE) against the plain table: same hidden states, same gradient of every weight. Controls: a
    fused table whose backward drops the residual gradient, and one whose k gradient is not
    rotated back, differ."""
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

    def unrotated(q, k, v, q_weight, k_weight, eps, order, cos, sin):  # NEGATIVE CONTROL: the fused QK-norm +
        from rl_engine.ops.qk_norm.op import qk_norm_kernel, qk_norm_rope_kernel  # RoPE with k's gradient

        k_out = qk_norm_rope_kernel(k, k_weight, eps, order, cos, sin, backend=TRITON)  # not rotated back
        k_plain = qk_norm_kernel(k, k_weight, eps, order, backend=TRITON)
        return (qk_norm_rope_kernel(q, q_weight, eps, order, cos, sin, backend=TRITON),
                k_out.detach() + (k_plain - k_plain.detach()))

    _, g_bad = step(lambda m: m.training_ops().replace(qk_norm_rope=unrotated))
    assert not all((a is None and c is None) or bits_equal(a, c) for a, c in zip(g_bad, base_g))


def test_bad_delta_is_refused_before_any_launch(device):
    x, d, w, _, _ = _inputs(3, 64, device)
    with pytest.raises(InputError, match="delta"):
        add_rms_norm_kernel(x, d[:2], w, EPS, backend=TRITON)
    with pytest.raises(InputError, match="delta"):
        add_rms_norm_kernel(x, d.float(), w, EPS, backend=TRITON)


def test_training_table_without_gradients_fuses_gate_up_and_swiglu(device):
    """Under ``torch.no_grad`` (teacher forcing for scoring) the Triton training table runs the gate
    / up projections and SwiGLU as one ``gate_up_swiglu`` call: the plain table's hidden states bit
    for bit, with the table's own launcher (the fused kernel where the GPU allows it, else the
    unfused launches) and with the fused kernel forced (the interpreter runs it), unpacked and
    packed. Control: a ``gate_up_swiglu`` with gate and up exchanged gives other hidden states."""
    import dataclasses

    from rl_engine.chain.config import get_config
    from rl_engine.chain.model import Qwen3Model
    from rl_engine.chain.weights import synthetic_weights
    from rl_engine.ops.det_gemm import triton as dg

    cfg = dataclasses.replace(get_config("tiny-smoke"), num_hidden_layers=1)
    b, s = 2, 5
    ids = torch.randint(0, cfg.vocab_size, (b * s,), generator=torch.Generator().manual_seed(4)).to(device)
    pos = torch.arange(s, device=device).repeat(b)
    cu = torch.arange(0, b * s + 1, s, dtype=torch.int32, device=device)
    model = Qwen3Model(synthetic_weights(cfg, 0, logit_scale=2.0, device=device), TRITON)
    calls = []

    def forced(a, w_gate, w_up):
        calls.append(a.shape)
        return dg.det_gemm_swiglu_launch(a, w_gate.t(), w_up.t(), dg.TREE_DEPTH, fused=True)

    def swapped(a, w_gate, w_up):  # NEGATIVE CONTROL
        return dg.det_gemm_swiglu_launch(a, w_up.t(), w_gate.t(), dg.TREE_DEPTH)

    with torch.no_grad():
        base = model.forward(ids, pos, cu_seqlens=cu, ops=model.ops)
        assert model.training_ops().has("gate_up_swiglu")
        for packed in (False, True):
            got = model.forward(ids, pos, cu_seqlens=cu, ops=model.training_ops(), packed=packed)
            assert bits_equal(got, base), packed
            got = model.forward(ids, pos, cu_seqlens=cu, ops=model.training_ops().replace(gate_up_swiglu=forced),
                                packed=packed)
            assert bits_equal(got, base), packed
        assert len(calls) == 2 * cfg.num_hidden_layers
        bad = model.forward(ids, pos, cu_seqlens=cu, ops=model.training_ops().replace(gate_up_swiglu=swapped))
        assert not bits_equal(bad, base)


def test_cuda_training_table_without_gradients_fuses_gate_up_and_swiglu(cuda_context, monkeypatch):
    """The same on ``cuda_bf16`` (on the GPU, else emulated): under ``torch.no_grad`` its training
    table's ``gate_up_swiglu`` site gives the plain table's hidden states bit for bit, unpacked and
    packed, with the one-launch kernel off and on (``GATE_UP_SWIGLU_FUSED``; on, packed, the kernel
    must have run once per layer); the site gives the same bits for a packed weight's halves (one
    launch) and for separate copies of them (two products, then swiglu). Control: the site with gate
    and up exchanged gives other hidden states."""
    import dataclasses

    from rl_engine.backends.registry import get_backend
    from rl_engine.chain.config import get_config
    from rl_engine.chain.model import Qwen3Model
    from rl_engine.chain.weights import synthetic_weights
    from rl_engine.ops.det_gemm import cuda as dg_cuda

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.type == "cpu":  # the host emulation stands in for the GPU the backend's probe asks for
        monkeypatch.setitem(get_backend("cuda_bf16")._cache, "answer", (True, "host emulation (tests only)"))
    cfg = dataclasses.replace(get_config("tiny-smoke"), num_hidden_layers=1)
    b, s = 2, 5
    with cuda_context():
        ids = torch.randint(0, cfg.vocab_size, (b * s,), generator=torch.Generator().manual_seed(4)).to(device)
        pos = torch.arange(s, device=device).repeat(b)
        cu = torch.arange(0, b * s + 1, s, dtype=torch.int32, device=device)
        model = Qwen3Model(synthetic_weights(cfg, 0, logit_scale=2.0, device=device), "cuda_bf16")
        table = model.training_ops()
        assert table.has("gate_up_swiglu")
        with torch.no_grad():
            base = model.forward(ids, pos, cu_seqlens=cu, ops=model.ops)
            for fused in (False, True):
                monkeypatch.setattr(dg_cuda, "GATE_UP_SWIGLU_FUSED", fused)
                for packed in (False, True):
                    before = dg_cuda.swiglu_launches()
                    got = model.forward(ids, pos, cu_seqlens=cu, ops=model.training_ops(), packed=packed)
                    assert bits_equal(got, base), (fused, packed)
                    ran = dg_cuda.swiglu_launches() - before
                    if packed or not fused:
                        assert ran == (cfg.num_hidden_layers if fused else 0), (fused, packed, ran)
            site = model.training_ops().impl("gate_up_swiglu")
            gate_up = model.packed_projections()[0].gate_up
            ffn = gate_up.shape[0] // 2
            a = torch.randn((7, gate_up.shape[1]), generator=torch.Generator().manual_seed(5)).to(torch.bfloat16)
            a = a.to(device)
            before = dg_cuda.swiglu_launches()
            one = site(a, gate_up[:ffn], gate_up[ffn:])
            assert dg_cuda.swiglu_launches() == before + 1
            assert bits_equal(site(a, gate_up[:ffn].clone(), gate_up[ffn:].clone()), one)
            assert dg_cuda.swiglu_launches() == before + 1  # separate copies: two products, then swiglu

            def swapped(a, w_gate, w_up):  # NEGATIVE CONTROL
                return site(a, w_up, w_gate)

            bad = model.forward(ids, pos, cu_seqlens=cu, ops=model.training_ops().replace(gate_up_swiglu=swapped),
                                packed=True)
            assert not bits_equal(bad, base)
