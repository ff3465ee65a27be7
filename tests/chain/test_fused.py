"""The decode step's fused launches (:mod:`rl_engine.chain.fused`) give the separate ops' bits, and
the model's forward with them (``Qwen3Model.decode_ops``) gives the plain forward's bits; each
comparison has a control that must fail."""

from __future__ import annotations

import pytest
import torch

from rl_engine.chain.fused import add_rms_norm, fused_decode_impls, qk_norm_rope
from rl_engine.chain.model import KVCache, Qwen3Model
from rl_engine.errors import InputError
from rl_engine.ops import spec as spec_mod
from rl_engine.ops.rms_norm.api import rms_norm

TRITON = "triton_cuda_bf16"


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int16)


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and torch.equal(_bits(a), _bits(b))


@pytest.mark.parametrize("order", ["hf", "fused"])
@pytest.mark.parametrize("t,e", [(1, 4096), (5, 200), (64, 256)])
def test_add_rms_norm_is_the_add_then_the_norm(device, t, e, order):
    """``add_rms_norm(x, d)`` is bitwise ``(x + d, rms_norm(x + d))`` on random inputs (the residual
    stream of a decode step at Qwen3-8B's E = 4096 included). Control: the comparison sees a
    change of one unit in the last place of one element of the sum."""
    g = spec_mod.make_generator(t * 31 + e)
    x = spec_mod.randn((t, e), g, device=device)
    d = spec_mod.randn((t, e), g, device=device)
    w = spec_mod.randn((e,), g, device=device)
    s, y = add_rms_norm(x, d, w, 1e-6, order)
    ref_s = x + d
    assert _same(s, ref_s)
    assert _same(y, rms_norm(ref_s, w, 1e-6, order, backend=TRITON))
    nudged = ref_s.clone()
    nudged.view(torch.int16)[t // 2, e // 3] += 1
    assert not _same(y, rms_norm(nudged, w, 1e-6, order, backend=TRITON))


def test_fused_launches_refuse_bad_input_before_any_launch(device):
    x = torch.zeros((2, 8), dtype=torch.bfloat16, device=device)
    w = torch.zeros((8,), dtype=torch.bfloat16, device=device)
    with pytest.raises(InputError, match="delta"):
        add_rms_norm(x, x[:, :4], w, 1e-6, "hf")
    with pytest.raises(InputError, match="order"):
        add_rms_norm(x, x, w, 1e-6, "fp32")
    with pytest.raises(InputError, match="x"):
        add_rms_norm(x.float(), x, w, 1e-6, "hf")
    k = torch.zeros((2, 2, 4), dtype=torch.bfloat16, device=device)
    kw = torch.zeros((4,), dtype=torch.bfloat16, device=device)
    tab = torch.zeros((2, 2), dtype=torch.float32, device=device)
    cache = torch.zeros((1, 4, 2, 4), dtype=torch.bfloat16, device=device)
    ix = torch.zeros((2,), dtype=torch.int64, device=device)

    def write(k_=k, v_cache=cache, positions=ix):
        return qk_norm_rope(k_, k_, k, kw, kw, 1e-6, "hf", tab, tab, k_cache=cache, v_cache=v_cache, rows=ix,
                            positions=positions)

    with pytest.raises(InputError, match="positions"):
        write(positions=ix.to(torch.int32))
    with pytest.raises(InputError, match="v_cache"):
        write(v_cache=cache[..., :2])
    with pytest.raises(InputError, match="q: expected"):
        write(k_=k.transpose(1, 2))
    assert set(fused_decode_impls("cuda_bf16", switched_off_too=True)) == {"add_rms_norm", "qk_norm_rope"}
    assert fused_decode_impls("torch_bf16") == {}


@pytest.mark.parametrize("backend", [TRITON, pytest.param("cuda_bf16", marks=pytest.mark.gpu)])
def test_decode_ops_give_the_plain_forwards_bits(micro_weights, device, backend):
    """A packed prefill with a KV cache and two decode steps, run with the engine's table
    (:meth:`Qwen3Model.decode_ops`: the fused residual norms, qk_norm + RoPE + K/V writes) and with the plain
    capture-safe table: hidden states and caches are bitwise equal, on each backend with its own
    fused launches. Control: an ``add_rms_norm`` that normalises in the other declared rounding
    order (``fused`` instead of ``hf``) is seen."""
    model = Qwen3Model(micro_weights, backend)
    ids = torch.tensor([5, 9, 2, 7, 1, 3, 8], dtype=torch.int64, device=device)
    pos = torch.tensor([0, 1, 2, 3, 0, 1, 2], dtype=torch.int64, device=device)
    cu = torch.tensor([0, 4, 7], dtype=torch.int32, device=device)

    def run(ops):
        cache = KVCache.allocate(model.config, 2, 8, model.dtype, model.device)
        outs = [model.forward(ids, pos, cu_seqlens=cu, cache=cache, ops=ops, packed=True)]
        for step in range(2):
            p = torch.tensor([4 + step, 3 + step], dtype=torch.int64, device=device)
            outs.append(model.forward(ids[:2], p, cache=cache, decode=True, ops=ops, packed=True))
        return outs, cache

    fused_ops = model.capture_safe_ops().replace(**fused_decode_impls(backend, switched_off_too=True))
    assert all(fused_ops.has(op) for op in ("add_rms_norm", "qk_norm_rope"))
    assert not model.capture_safe_ops().has("add_rms_norm")
    plain, plain_cache = run(model.capture_safe_ops())
    fused, fused_cache = run(fused_ops)
    for a, b in zip(plain, fused):
        assert _same(a, b)
    for a, b in zip(plain_cache.k + plain_cache.v, fused_cache.k + fused_cache.v):
        assert _same(a, b)

    fused_norm = fused_decode_impls(backend, switched_off_too=True)["add_rms_norm"]

    def other_order(x, delta, weight, eps, order):
        return fused_norm(x, delta, weight, eps, "fused" if order == "hf" else "hf")

    control, _ = run(fused_ops.replace(add_rms_norm=other_order))
    assert not _same(control[0], plain[0])


@pytest.mark.parametrize("order", ["hf", "fused"])
def test_qk_norm_rope_is_the_norms_the_rotations_and_the_cache_write(device, order):
    """One launch gives ``rope(qk_norm(q))``, ``rope(qk_norm(k))`` and the cache of the separate
    ops (q/k/v as column views of one packed product, D = 128 as in Qwen3). Control: the rotation
    run backwards (sin negated) is seen."""
    from rl_engine.ops.qk_norm.api import qk_norm
    from rl_engine.ops.rope.api import rope

    g = spec_mod.make_generator(11)
    t, h, hkv, d, b, s_max = 3, 4, 2, 128, 2, 6
    qkv = spec_mod.randn((t, (h + 2 * hkv) * d), g, device=device)
    q = qkv[:, : h * d].reshape(t, h, d)
    k = qkv[:, h * d : (h + hkv) * d].reshape(t, hkv, d)
    v = qkv[:, (h + hkv) * d :].reshape(t, hkv, d)
    qw = spec_mod.randn((d,), g, device=device)
    kw = spec_mod.randn((d,), g, device=device)
    ang = torch.rand((t, d // 2), generator=torch.Generator().manual_seed(3)).to(device) * 6.0
    cos, sin = torch.cos(ang), torch.sin(ang)
    rows = torch.tensor([0, 1, 1], dtype=torch.int64, device=device)
    pos = torch.tensor([2, 0, 5], dtype=torch.int64, device=device)

    def caches():
        return [torch.full((b, s_max, hkv, d), float("nan"), dtype=torch.bfloat16, device=device) for _ in range(2)]

    kc, vc = caches()
    q_out, k_out = qk_norm_rope(q, k, v, qw, kw, 1e-6, order, cos, sin, k_cache=kc, v_cache=vc, rows=rows,
                                positions=pos)
    ref_q = rope(qk_norm(q, qw, 1e-6, order, backend=TRITON), cos, sin, backend=TRITON)
    ref_k = rope(qk_norm(k, kw, 1e-6, order, backend=TRITON), cos, sin, backend=TRITON)
    rk, rv = caches()
    rk[rows, pos] = ref_k
    rv[rows, pos] = v
    assert _same(q_out, ref_q) and _same(k_out, ref_k) and _same(kc, rk) and _same(vc, rv)
    no_cache = qk_norm_rope(q, k, v, qw, kw, 1e-6, order, cos, sin)
    assert _same(no_cache[0], ref_q) and _same(no_cache[1], ref_k)
    back = qk_norm_rope(q, k, v, qw, kw, 1e-6, order, cos, -sin)
    assert not _same(back[0], ref_q) and not _same(back[1], ref_k)
    with pytest.raises(InputError, match="go together"):
        qk_norm_rope(q, k, v, qw, kw, 1e-6, order, cos, sin, k_cache=kc)
    with pytest.raises(InputError, match="cos"):
        qk_norm_rope(q, k, v, qw, kw, 1e-6, order, cos.double(), sin)


@pytest.mark.gpu
@pytest.mark.parametrize("batch", [1, 16, 64])
def test_cuda_decode_bits_do_not_depend_on_the_pdl_mode(batch):
    """``cuda_bf16``'s decode forward at Qwen3-8B layer shapes (two layers; B = 64 runs the warpgroup
    GEMV, B <= 16 the warp GEMV) gives the same bits with
    programmatic dependent launch off (mode 0) and in the decode mode (2: each kernel starts while
    the one before it finishes and copies its weight meanwhile), eagerly and in 20 replays of a
    captured step. A kernel that read its predecessor's output before ``pdl_wait`` would race and
    differ in some replay. Control: a decode with one weight element changed is seen."""
    from rl_engine.chain import fused
    from rl_engine.chain.config import Qwen3Config
    from rl_engine.chain.weights import synthetic_weights
    from rl_engine.graphs import capture

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    dev = torch.device("cuda")
    cfg = Qwen3Config(vocab_size=1024, hidden_size=4096, intermediate_size=12288, num_hidden_layers=2,
                      num_attention_heads=32, num_key_value_heads=8, head_dim=128, rms_norm_eps=1e-6, rope_theta=1e6,
                      tie_word_embeddings=False, max_position_embeddings=2048)
    model = Qwen3Model(synthetic_weights(cfg, 0, logit_scale=2.0, device=dev), "cuda_bf16")
    ops = model.decode_ops()
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(0, cfg.vocab_size, (batch,), generator=gen).to(dev)
    pos = ((torch.arange(batch, dtype=torch.int64) * 37) % 1300 + 700).to(dev)  # inside the 2048-row cache

    def forward(mode: int, graph: bool) -> list[torch.Tensor]:
        old = fused.CUDA_DECODE_PDL, fused.CUDA_DECODE_PDL_MAX_BATCH
        fused.CUDA_DECODE_PDL, fused.CUDA_DECODE_PDL_MAX_BATCH = mode, batch
        try:
            cache = KVCache.allocate(cfg, batch, 2048, model.dtype, dev)
            for t in cache.k + cache.v:  # a filled cache: every visible key is read
                t.copy_(torch.randn(t.shape, generator=gen.manual_seed(2)).to(t.dtype))

            def step() -> torch.Tensor:
                return model.forward(ids, pos, cache=cache, decode=True, checked=True, ops=ops, packed=True)

            if not graph:
                with torch.no_grad():
                    return [step().clone()]
            g, out = capture(step)
            outs = []
            for _ in range(20):
                g.replay()
                outs.append(out.clone())
            return outs
        finally:
            fused.CUDA_DECODE_PDL, fused.CUDA_DECODE_PDL_MAX_BATCH = old

    reference = forward(0, graph=False)[0]
    for mode in (0, 2):
        for graph in (False, True):
            for i, h in enumerate(forward(mode, graph)):
                assert _same(h, reference), f"PDL mode {mode}, graph {graph}, replay {i}: bits differ"

    w = model.weights.layers[1].down_proj
    saved = w[7, 11].clone()
    w[7, 11] = saved + 1.0
    try:
        assert not _same(forward(2, graph=False)[0], reference)
    finally:
        w[7, 11] = saved
