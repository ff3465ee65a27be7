"""A decode step of the tiny Qwen3 model as a CUDA graph and under torch.compile(fullgraph=True)
(issue #18): the ops are torch ops and, once the plan is validated, nothing on the step's path
reads a device value on the host. The captured / compiled step must give the eager step's bits."""

from __future__ import annotations

import pytest
import torch

from rl_engine.backends.registry import KERNEL_BACKENDS

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs and inductor need a CUDA GPU")]

B, S_MAX, PROMPT = 3, 48, (7, 12, 5)


def _model(backend, device):
    from rl_engine.chain.config import get_config
    from rl_engine.chain.model import Qwen3Model
    from rl_engine.chain.weights import synthetic_weights
    from rl_engine.backends.registry import availability

    ok, why = availability(backend)
    if not ok:
        pytest.skip(why)
    return Qwen3Model(synthetic_weights(get_config("tiny"), 0, logit_scale=2.0, device=device), backend)


def _capture_safe_ops(model, backend):
    """The model's op table with the two ops whose full validation reads device values (token ids
    in [0, V), cache_seqlens in [0, S_max]) called with ``validate=False``; the test validates
    those values itself, once, before the step."""
    from rl_engine.ops.attention.api import attention_decode_kernel
    from rl_engine.ops.embedding.api import embedding_kernel

    return model.ops.replace(
        embedding=lambda ids, weight: embedding_kernel(ids, weight, backend=backend, validate=False),
        attention_decode=lambda **kw: attention_decode_kernel(**kw, backend=backend, validate=False))


def _prefilled_cache(model, device):
    from rl_engine.chain.model import KVCache

    g = torch.Generator().manual_seed(5)
    lens = torch.tensor(PROMPT)
    ids = torch.randint(0, model.config.vocab_size, (int(lens.sum()),), generator=g).to(device)
    positions = torch.cat([torch.arange(n) for n in PROMPT]).to(device)
    cu = torch.zeros(B + 1, dtype=torch.int32)
    cu[1:] = torch.cumsum(lens, 0)
    cache = KVCache.allocate(model.config, B, S_MAX, model.dtype, device)
    model.forward(ids, positions, cu_seqlens=cu.to(device), cache=cache)
    return cache


def _copy(cache):
    from rl_engine.chain.model import KVCache

    return KVCache([k.clone() for k in cache.k], [v.clone() for v in cache.v])


def _same_bits(a, b):
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(a.view(torch.int16), b.view(torch.int16))


def _step_inputs(model, device, seed):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, model.config.vocab_size, (B,), generator=g).to(device)
    pos = torch.tensor(PROMPT, dtype=torch.int64, device=device)  # the slot after each prompt
    return ids, pos


@pytest.mark.parametrize("backend", KERNEL_BACKENDS)
def test_decode_step_in_a_cuda_graph_replays_new_ids_with_the_eager_bits(backend):
    device = torch.device("cuda")
    model = _model(backend, device)
    ops = _capture_safe_ops(model, backend)
    cache0 = _prefilled_cache(model, device)
    model.check_positions(0, max(PROMPT), S_MAX, "decode")  # the plan, validated once on the host

    graph_cache = _copy(cache0)
    ids_buf, pos_buf = _step_inputs(model, device, 0)

    def step(cache, ids, pos):
        hidden = model.forward(ids, pos, cache=cache, decode=True, checked=True, ops=ops)
        return model.logits(hidden)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up: Triton compiles and the CUDA library loads outside the capture
        step(graph_cache, ids_buf, pos_buf)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        logits_out = step(graph_cache, ids_buf, pos_buf)

    for seed in (1, 2):  # new token ids each replay, the cache reset to the prefilled state
        ids, pos = _step_inputs(model, device, seed)
        for dst, src in zip(graph_cache.k + graph_cache.v, cache0.k + cache0.v):
            dst.copy_(src)
        ids_buf.copy_(ids)
        pos_buf.copy_(pos)
        graph.replay()
        eager_cache = _copy(cache0)
        want = step(eager_cache, ids, pos)
        torch.cuda.synchronize()
        assert want.dtype == torch.float32 and torch.equal(logits_out.view(torch.int32), want.view(torch.int32))
        assert all(_same_bits(a, b) for a, b in zip(graph_cache.k + graph_cache.v, eager_cache.k + eager_cache.v))
    # negative control: the replayed output follows the new ids (a stale graph would not)
    ids_other, _ = _step_inputs(model, device, 3)
    stale = step(_copy(cache0), ids_other, pos)
    assert not torch.equal(stale, logits_out)


@pytest.mark.parametrize("backend", KERNEL_BACKENDS)
def test_decode_step_compiles_with_fullgraph_and_gives_the_eager_bits(backend):
    device = torch.device("cuda")
    model = _model(backend, device)
    ops = _capture_safe_ops(model, backend)
    cache0 = _prefilled_cache(model, device)
    model.check_positions(0, max(PROMPT), S_MAX, "decode")
    ids, pos = _step_inputs(model, device, 1)

    def step(cache_k, cache_v, ids, pos):
        from rl_engine.chain.model import KVCache

        cache = KVCache(list(cache_k), list(cache_v))
        return model.forward(ids, pos, cache=cache, decode=True, checked=True, ops=ops)

    torch._dynamo.reset()
    compiled = torch.compile(step, fullgraph=True)  # a graph break raises here instead of falling back
    ck, cv = [k.clone() for k in cache0.k], [v.clone() for v in cache0.v]
    got = compiled(ck, cv, ids, pos)
    ek, ev = [k.clone() for k in cache0.k], [v.clone() for v in cache0.v]
    want = step(ek, ev, ids, pos)
    torch.cuda.synchronize()
    assert _same_bits(got, want)
    assert all(_same_bits(a, b) for a, b in zip(ck + cv, ek + ev))
