"""The eager training path of every kernel op: :func:`rl_engine.ops._torch_op.run` applies an
``autograd.Function`` built from the op's own body, setup and backward functions
(``register_autograd``) instead of the custom op's generic autograd wrapper. Both entries run the
same launcher, so each forward op of the opcheck cases (``tests/ops/test_opcheck.py``) must give
the same output and gradient bits either way, and the eager call must really take the Function
(its ``grad_fn``), while the control with the Functions removed takes the torch op."""

from __future__ import annotations

import pytest
import torch

from rl_engine.backends.registry import availability
from rl_engine.ops import _torch_op
from tests.ops.test_opcheck import CASES


def _grad_calls(backend, device):
    """(id, torch op, args) of the opcheck cases that take an input requiring grad: the
    differentiable forward calls (whether or not their op has an eager Function)."""
    out = []
    for op in sorted(CASES):
        for name, torch_op, args in CASES[op](backend, device):
            if any(isinstance(a, torch.Tensor) and a.requires_grad for a in args):
                out.append((f"{op}/{name}", torch_op, args))
    return out


def _body(torch_op):
    """The function registered as ``torch_op`` (what run() calls when autograd is not recording;
    never reached here, every call records)."""
    return lambda *args: pytest.fail(f"{torch_op} ran its body outside autograd")


def _forward_backward(torch_op, args):
    """Outputs and input gradients of ``run(torch_op, body, *args)`` with a fixed upstream gradient
    per output, plus the name of the first output's grad_fn."""
    leaves = [a.detach().requires_grad_(True) if isinstance(a, torch.Tensor) and a.requires_grad else a
              for a in args]
    out = _torch_op.run(torch_op, _body(torch_op), *leaves)
    outs = out if isinstance(out, tuple) else (out,)
    node = type(outs[0].grad_fn).__name__
    diff = [o for o in outs if o.requires_grad]
    g = torch.Generator().manual_seed(5)
    grads = [torch.randn(o.shape, generator=g).to(o.dtype).to(o.device) for o in diff]
    inputs = [a for a in leaves if isinstance(a, torch.Tensor) and a.requires_grad]
    dins = torch.autograd.grad(diff, inputs, grads, allow_unused=True)
    return [o.detach() for o in outs], list(dins), node


def _same_bits(x, y) -> bool:
    if x is None or y is None:
        return x is None and y is None
    if x.dtype != y.dtype or x.shape != y.shape or x.stride() != y.stride():
        return False
    return torch.equal(x.contiguous().view(torch.uint8), y.contiguous().view(torch.uint8))


def test_every_differentiable_op_has_an_eager_function(device):
    """Every torch op that the opcheck cases call with a gradient has its eager Function."""
    calls = _grad_calls("triton_cuda_bf16", device)
    from rl_engine import OPS

    assert {n.split("/")[0] for n, _, _ in calls} == set(OPS)  # each of the 13 ops has a differentiable call
    missing = sorted({n for n, op, _ in calls if op not in _torch_op._EAGER_FUNCTIONS})
    assert not missing, f"no eager Function: {missing}"


def test_traced_calls_take_the_torch_op(device):
    """Under a dispatch mode (FakeTensor here; torch.compile and functionalization likewise) run()
    calls the torch op even when autograd records: the eager Function is for plain eager only."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from rl_engine.ops.det_gemm.api import det_gemm_op

    with FakeTensorMode():
        a = torch.empty((4, 8), dtype=torch.bfloat16, device=device).requires_grad_(True)
        w = torch.empty((6, 8), dtype=torch.bfloat16, device=device)
        out = _torch_op.run(det_gemm_op, _body(det_gemm_op), a, w.t(), 2, False, "triton_cuda_bf16")
    assert type(out.grad_fn).__name__.startswith("GeneratedBackwardFor_")


@pytest.mark.parametrize("backend", ["triton_cuda_bf16"])
def test_eager_function_gives_the_torch_ops_bits(backend, device, monkeypatch):
    ok, why = availability(backend)
    if not ok:
        pytest.skip(why)
    calls = _grad_calls(backend, device)
    assert calls
    eager = {n: _forward_backward(op, args) for n, op, args in calls}
    monkeypatch.setattr(_torch_op, "_EAGER_FUNCTIONS", {})  # control: the custom op's own autograd
    for name, op, args in calls:
        outs, grads, node = eager[name]
        outs_t, grads_t, node_t = _forward_backward(op, args)
        assert node.startswith("Eager_"), f"{name}: eager call went through {node}"
        assert node_t.startswith("GeneratedBackwardFor_"), f"{name}: control went through {node_t}"
        assert all(_same_bits(a, b) for a, b in zip(outs, outs_t)), f"{name}: outputs differ"
        assert len(grads) == len(grads_t) and all(_same_bits(a, b) for a, b in zip(grads, grads_t)), \
            f"{name}: gradients differ"


def _dispatched_ops(fn) -> set[str]:
    """Names of the ``rl_engine::`` torch ops the dispatcher ran during ``fn()`` (profiler events)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    return {e.name for e in prof.events() if e.name.startswith("rl_engine::")}


def test_eager_backward_calls_the_kernels_without_the_dispatcher(device, monkeypatch):
    """A plain eager backward runs the backward kernels' bodies (``_torch_op.call``), not their
    torch ops: no ``rl_engine::`` op reaches the dispatcher. Control: with every call taken as
    traced, the same backward dispatches ``rl_engine::silu_bwd`` and ``rl_engine::det_gemm``."""
    ok, why = availability("triton_cuda_bf16")
    if not ok:
        pytest.skip(why)
    from rl_engine.ops.det_gemm import det_gemm
    from rl_engine.ops.silu import silu

    g = torch.Generator().manual_seed(3)
    x = torch.randn((4, 16), generator=g).to(torch.bfloat16).to(device).requires_grad_(True)
    w = torch.randn((8, 16), generator=g).to(torch.bfloat16).to(device).requires_grad_(True)

    def step():
        y = det_gemm(silu(x, backend="triton_cuda_bf16"), w.t(), backend="triton_cuda_bf16")
        return torch.autograd.grad(y.float().sum(), (x, w))

    grads = []
    assert _dispatched_ops(lambda: grads.append(step())) == set()
    monkeypatch.setattr(_torch_op, "_traced", lambda: True)
    assert {"rl_engine::silu_bwd", "rl_engine::det_gemm"} <= _dispatched_ops(lambda: grads.append(step()))
    assert all(_same_bits(a, b) for a, b in zip(*grads)), "the dispatcher path gave other gradient bits"
