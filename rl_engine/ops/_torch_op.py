"""How an op reaches its kernels: one path per op, the kernel backend as an argument.

Every kernel op is a ``torch.library`` custom op (``rl_engine::<op>_fwd``, ``rl_engine::<op>_bwd``,
...) with a fake (meta) implementation and its autograd registered on it, defined once in the
op's ``api.py`` next to the op's input validation. The backend is a ``str`` argument of the op
(``"triton_cuda_bf16"`` or ``"cuda_bf16"``); the op body asks :func:`launchers` for that backend's
module (``rl_engine/ops/<op>/triton.py`` or ``cuda.py``), which holds only kernels and launchers
with the same names and signatures in both backends. So:

* validation, docstrings and autograd exist once per op, not once per backend;
* importing the CUDA backend needs no Triton, and no backend module imports another backend's;
* ``torch.library.opcheck``, ``torch.compile`` and FakeTensor tracing see every kernel as an op
  (the fake implementations give shapes, dtypes and strides without running anything).

The host-side checks that need a device (is there a GPU of the right capability, is the Triton
interpreter on) run once per (backend, device) and are cached by :func:`check_device`; the op
path itself then does no host synchronisation.

:func:`run` calls a forward torch op. In plain eager mode with autograd not recording (a decode
step under ``torch.no_grad()``), the dispatcher round trip of a Python custom op would do nothing
but call the op's body, and costs more than the launch itself; :func:`run` then calls the body
directly (the very function registered as the op, so the same launcher and the same bits). In
eager mode with autograd recording (a training forward), it applies a ``torch.autograd.Function``
built by :func:`register_autograd` from the op's own body, setup and backward functions: the
custom op's generic autograd wrapper cost about 40 us of host time per call, and a Qwen3-8B
training forward (612 op calls, many kernels shorter than that) was launch-bound (27 ms of idle
GPU time on the H200, ``evidence/2026-12-03-h200-issue33-6cc1ecf/``). Under ``torch.compile``, any
dispatch mode (FakeTensor, functionalization, tracing) or a functorch transform, the torch op is
called.
"""

from __future__ import annotations

import importlib
from types import ModuleType

import torch

from rl_engine.errors import BackendUnavailable

KERNEL_BACKENDS = ("triton_cuda_bf16", "cuda_bf16")
"""The backends whose kernels run through the ops' custom ops (``backends.registry.KERNEL_BACKENDS``)."""

_MODULE = {"triton_cuda_bf16": "triton", "cuda_bf16": "cuda"}
_LAUNCHERS: dict[tuple[str, str], ModuleType] = {}


def launchers(op: str, backend: str) -> ModuleType:
    """The launcher module of ``op`` on ``backend`` (``rl_engine.ops.<op>.triton`` / ``.cuda``),
    imported on first use and cached. Raises BackendUnavailable for any other backend name."""
    key = (op, backend)
    mod = _LAUNCHERS.get(key)
    if mod is None:
        if backend not in _MODULE:
            raise BackendUnavailable(f"{op}: {backend!r} is not a kernel backend; kernel backends: "
                                     f"{', '.join(KERNEL_BACKENDS)}")
        mod = importlib.import_module(f"rl_engine.ops.{op}.{_MODULE[backend]}")
        _LAUNCHERS[key] = mod
    return mod


def _check_device_slow(backend: str, tensors: tuple[torch.Tensor, ...]) -> None:
    """The backends' own checks (each caches what it can: ``check_triton_device``,
    ``cuda_launch.check_cuda_device``)."""
    if backend == "triton_cuda_bf16":
        from rl_engine.ops._triton_common import check_triton_device

        check_triton_device(*tensors)
    elif backend == "cuda_bf16":
        from rl_engine.backends.cuda_launch import check_cuda_device

        check_cuda_device(*tensors)
    else:
        raise BackendUnavailable(f"{backend!r} is not a kernel backend; kernel backends: {', '.join(KERNEL_BACKENDS)}")


_CUDA_READY: set[tuple[str, torch.device]] = set()


def check_device(backend: str, *tensors: torch.Tensor) -> None:
    """Raise BackendUnavailable unless ``backend`` can launch on the devices of ``tensors``.

    CUDA devices found ready are cached here per backend (a set lookup per tensor on the hot
    path); CPU tensors (the Triton interpreter, the host emulation of the CUDA sources) are asked
    every call, since those settings can change within a process."""
    for t in tensors:
        dev = t.device
        if dev.type != "cuda" or (backend, dev) not in _CUDA_READY:
            _check_device_slow(backend, tensors)
            for u in tensors:
                if u.device.type == "cuda":
                    _CUDA_READY.add((backend, u.device))
            return


_EAGER_FUNCTIONS: dict[object, type[torch.autograd.Function]] = {}


def register_autograd(torch_op, body, backward, setup_context) -> None:
    """Register ``backward`` / ``setup_context`` as ``torch_op``'s autograd formula, and build from
    the very same two functions the ``torch.autograd.Function`` that :func:`run` applies in plain
    eager mode (forward: ``body``, the function registered as ``torch_op``). One formula, two
    entries: the torch op for ``torch.compile``, dispatch modes and ``opcheck``; the Function for
    eager training, where the custom op's generic autograd wrapper (re-dispatch, default filling,
    the dynamo guard around the body) costs the host more than the kernel launch itself."""
    if getattr(torch_op, "_init_fn", body) is not body:  # the Function must run what the op runs
        raise RuntimeError(f"register_autograd: {torch_op} was not defined with {getattr(body, '__name__', body)}")
    torch_op.register_autograd(backward, setup_context=setup_context)

    def forward(ctx, *args):
        # The ctx-taking form: Function.apply binds a separate setup_context's arguments through
        # inspect.signature on every call (a third of this path's host time); run() never applies
        # it under a functorch transform, the one place that needs the separate form.
        out = body(*args)
        setup_context(ctx, args, out)
        return out

    name = getattr(torch_op, "_name", getattr(body, "__name__", "op")).replace("::", "_")
    _EAGER_FUNCTIONS[torch_op] = type(f"Eager_{name}", (torch.autograd.Function,), {
        "forward": staticmethod(forward),
        "backward": staticmethod(lambda ctx, *grads: backward(ctx, *grads)),
    })


def _traced() -> bool:
    """Whether the call is being compiled, traced or run under a dispatch mode (FakeTensor,
    functionalization, a functorch transform): then only the torch op is correct."""
    return (torch.compiler.is_compiling() or torch._C._len_torch_dispatch_stack() > 0
            or torch._C._are_functorch_transforms_active())


def run(torch_op, body, *args):
    """Call the op: ``torch_op(*args)`` when compiled, traced or under a dispatch mode; in plain
    eager mode, ``body(*args)`` (the function registered as ``torch_op``) when autograd is not
    recording, and the op's eager ``autograd.Function`` (:func:`register_autograd`: the same body,
    setup and backward) when it is. All three run the same launcher, so the same bits."""
    if _traced():
        return torch_op(*args)
    if torch.is_grad_enabled() and any(isinstance(a, torch.Tensor) and a.requires_grad for a in args):
        fn = _EAGER_FUNCTIONS.get(torch_op)
        return torch_op(*args) if fn is None else fn.apply(*args)
    return body(*args)


def call(torch_op, *args):
    """:func:`run` for an op defined with the ``@torch.library.custom_op`` decorator, whose body is
    the op's own function (``torch_op._init_fn``): the backward functions call their kernels'
    torch ops through this. A backward runs with autograd off (unless ``create_graph``), so in
    plain eager mode the op's body is called directly and the dispatcher round trip (about 40 us of
    host time per call; ~800 calls in a Qwen3-8B backward) is skipped; under compilation, tracing
    or a dispatch mode the torch op is called, as :func:`run` does."""
    body = getattr(torch_op, "_init_fn", None)
    if body is None:  # not a Python custom op: nothing to skip
        return torch_op(*args)
    return run(torch_op, body, *args)


def grad_bf16(g: torch.Tensor) -> torch.Tensor:
    """An upstream gradient as the backward kernels take it: BF16, unit stride on the last axis
    (a copy only when needed; a length-1 last axis needs none)."""
    g = g.to(torch.bfloat16)
    if g.dim() == 0 or g.shape[-1] <= 1 or g.stride(-1) == 1:
        return g
    return g.contiguous()


def placeholder(t: torch.Tensor | None, needed: bool, like: torch.Tensor) -> torch.Tensor:
    """What a backward torch op returns for one gradient: ``t`` where it was asked for, else a
    0-element tensor of ``t``'s dtype (``like``'s when ``t`` is None) on ``like``'s device (a
    custom op returns tensors, never None; a launcher may compute a gradient nobody asked for)."""
    if needed:
        return t
    return like.new_empty((0,), dtype=t.dtype if t is not None else like.dtype)

