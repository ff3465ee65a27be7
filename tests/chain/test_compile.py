"""The chain's forwards trace into one graph (issue #18): ``torch.compile(fullgraph=True)`` raises on
any graph break, so these tests fail if anything on the op path reads a device value on the host,
imports a module, or calls what dynamo cannot trace. On a CPU the compile backend is ``eager``
(dynamo's trace only; the ops are opaque torch ops, so the kernels are the same and so are the
bits); ``tests/chain/test_capture_gpu.py`` compiles with inductor on the H200."""

from __future__ import annotations

import contextlib

import pytest
import torch

from rl_engine.backends.registry import KERNEL_BACKENDS, availability
from rl_engine.chain.model import KVCache, Qwen3Model

B, S_MAX = 2, 16
LENS = (3, 4)


@pytest.fixture(scope="module", params=KERNEL_BACKENDS)
def model(request, micro_weights):
    ok, why = availability(request.param)
    if not ok:
        pytest.skip(why)
    return Qwen3Model(micro_weights, request.param)


def _compile(fn):
    torch._dynamo.reset()
    return torch.compile(fn, fullgraph=True, backend="eager" if not torch.cuda.is_available() else "inductor")


def _bits(x):
    return x.view(torch.int16)


def _packed(model):
    g = torch.Generator().manual_seed(2)
    dev = model.device
    ids = torch.randint(0, model.config.vocab_size, (sum(LENS),), generator=g).to(dev)
    pos = torch.cat([torch.arange(n) for n in LENS]).to(dev)
    cu = torch.tensor([0, LENS[0], sum(LENS)], dtype=torch.int32, device=dev)
    return ids, pos, cu


def test_teacher_forcing_forward_traces_with_fullgraph(model):
    ops = model.capture_safe_ops()
    ids, pos, cu = _packed(model)
    plan = model.varlen_plan(cu, int(ids.shape[0]))  # cu_seqlens read once, outside the graph
    model.check_positions(0, max(LENS) - 1)

    def tf(ids, pos, cu):
        return model.forward(ids, pos, cu_seqlens=cu, checked=True, ops=ops, plan=plan)

    with torch.no_grad():
        want = tf(ids, pos, cu)
        got = _compile(tf)(ids, pos, cu)
    assert torch.equal(_bits(got), _bits(want))


def test_decode_step_traces_with_fullgraph(model):
    ops = model.capture_safe_ops()
    cache = KVCache.allocate(model.config, B, S_MAX, torch.bfloat16, model.device, fill=0.0)
    ids = torch.tensor([3, 4], device=model.device)
    pos = torch.tensor([2, 5], device=model.device)
    model.check_positions(0, 5, S_MAX, "decode")

    def step(ck, cv, ids, pos):
        return model.forward(ids, pos, cache=KVCache(list(ck), list(cv)), decode=True, checked=True, ops=ops)

    with torch.no_grad():
        want = step([k.clone() for k in cache.k], [v.clone() for v in cache.v], ids, pos)
        got = _compile(step)([k.clone() for k in cache.k], [v.clone() for v in cache.v], ids, pos)
    assert torch.equal(_bits(got), _bits(want))


def test_a_forward_that_reads_cu_seqlens_breaks_the_graph(model):
    """Negative control: without the plan, attention validates cu_seqlens on the host, which is
    a data-dependent branch dynamo cannot put in one graph, so fullgraph compilation must raise."""
    ops = model.capture_safe_ops()
    ids, pos, cu = _packed(model)

    def tf(ids, pos, cu):
        return model.forward(ids, pos, cu_seqlens=cu, checked=True, ops=ops)

    with torch.no_grad(), pytest.raises(Exception, match="(?i)data-dependent|graph break|guard"):
        _compile(tf)(ids, pos, cu)


def test_the_cuda_decode_launch_scope_traces_with_fullgraph_and_is_a_library_call_outside():
    """The cuda_bf16 decode forward's PDL scope (``decode_launch_scope``) sets the mode through the
    loaded library, which Dynamo cannot trace (a lock, then ctypes): inside ``torch.compile`` the
    scope must be empty, or a compiled cuda_bf16 decode step breaks the graph on the H200 (as
    ``test_capture_gpu.py`` found at 756883c). Checked here with a stand-in for the library call,
    which the eager scope must reach (the control) and the compiled one must not."""
    from unittest import mock

    from rl_engine.chain import fused

    calls: list[int] = []

    @contextlib.contextmanager
    def fake_programmatic_launch(mode):
        calls.append(mode)
        import threading

        with threading.Lock():  # what load_library does: Dynamo refuses to enter it
            yield

    def step(x):
        with fused.decode_launch_scope("cuda_bf16", torch.device("cuda"), 1):
            return x + 1

    x = torch.zeros(3)
    with mock.patch("rl_engine.backends.cuda_launch.programmatic_launch", fake_programmatic_launch):
        assert torch.equal(step(x), x + 1) and calls == [fused.CUDA_DECODE_PDL]  # eager: the mode is set
        calls.clear()
        torch._dynamo.reset()
        got = torch.compile(step, fullgraph=True, backend="eager")(x)
    assert torch.equal(got, x + 1) and calls == []
