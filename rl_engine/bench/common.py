"""Shared pieces of the benchmark modules: model sizes, the case description, an input pool.

A :class:`Case` is one op at one shape (one token count). It knows how to size itself from a
:class:`Dims` (Qwen3-8B for real runs, :data:`TINY` for ``--dry-run``), count its FLOPs and bytes
(:mod:`rl_engine.bench.counts`, always at the real size), build its inputs, and make zero-argument
callables for "ours" (per backend) and for each :class:`Baseline`. Inputs are built once per case,
outside every timed region; each implementation gets them in its native layout.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

METRICS = ("TFLOP/s", "GB/s", "tokens/s", "ms", "GiB")
"""Rates (higher is better) and costs (lower is better). tokens/s: the case's ``tokens`` per second
of one call (the whole-chain teacher forcing and train step rows)."""
HIGHER_IS_BETTER = {"TFLOP/s": True, "GB/s": True, "tokens/s": True, "ms": False, "GiB": False}


@dataclass(frozen=True)
class Dims:
    """Model sizes a case is built from."""

    name: str
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    vocab: int
    rms_norm_eps: float
    rope_theta: float
    decode_context: int
    """Cached keys per sequence in the decode benchmark (every sequence full)."""


QWEN3_8B = Dims(name="qwen3-8b", hidden=4096, heads=32, kv_heads=8, head_dim=128, ffn=12288, vocab=151936,
                rms_norm_eps=1e-6, rope_theta=1e6, decode_context=4096)
TINY = Dims(name="tiny", hidden=64, heads=4, kv_heads=2, head_dim=32, ffn=96, vocab=320,
            rms_norm_eps=1e-6, rope_theta=1e6, decode_context=9)
"""Shapes of ``--dry-run`` (CPU, Triton interpreter): every callable runs once, nothing is timed."""


def tiny_tokens(tokens: int) -> int:
    """The token count a ``--dry-run`` uses in place of ``tokens``: 1 stays 1 (the decode edge),
    up to 16 becomes 3, larger becomes 5 (odd, so tails and masks are exercised)."""
    if tokens <= 1:
        return 1
    return 3 if tokens <= 16 else 5


@dataclass
class Baseline:
    """What a row compares ours with.

    ``peak`` (``"copy"`` / ``"cublas"``): the value is the peak measured in the same run (copy
    bandwidth in GB/s, cuBLAS BF16 in TFLOP/s). Otherwise ``make(state)`` returns the callable to
    time (or ``(callable, note)``). ``requires`` names a module that must import (Liger-Kernel);
    when it does not, the row says "not installed". ``needs_cuda``: the callable only runs on a GPU.
    """

    label: str
    make: Callable[[dict], Any] | None = None
    peak: str | None = None
    requires: str | None = None
    needs_cuda: bool = False
    target: str | None = None
    primary: bool = False


@dataclass
class Case:
    """One benchmarked op at one shape."""

    op: str
    """Bench item: det_gemm, lm_head, attention_fwd, attention_fwd_bwd, attention_decode, rms_norm,
    rope, swiglu, silu, linear_logp, chain_decode, chain_generate, chain_teacher_forcing, chain_train_step."""
    family: str
    kernel_op: str
    """The rl_engine op whose ``triton_cuda_bf16`` / ``cuda_bf16`` implementation is timed."""
    variant: str
    tokens: int
    """The real token count (GEMM M, prefill length, decode batch, ``B * L`` of a whole-chain
    forward): the ``T`` of the row key, and what tokens/s divides by the time."""
    metric: str
    sizes: Callable[[Dims, int], dict[str, int]]
    label: Callable[[dict[str, int]], str]
    count: Callable[[dict[str, int]], tuple[int, int]]
    build: Callable[[dict[str, int], Dims, "Pool"], dict[str, Any]]
    ours: Callable[[str, dict[str, Any]], Callable[[], Any]]
    baselines: list[Baseline] = field(default_factory=list)
    measure: str = "time"
    """``time`` (do_bench), ``once`` (one timed call after one warm-up: calls of seconds), ``calls``
    (the median of a few timed calls after one warm-up: calls of about a second) or
    ``memory`` (peak allocated bytes of one call)."""

    @property
    def key(self) -> str:
        return f"{self.op}/{self.variant}/T{self.tokens}"


class Pool:
    """Seeded random inputs on one device, memoised by name and shape so that cases of one
    family share their large weights (cleared between families). Values are drawn in FP32 on the
    device from a generator seeded by ``(seed, name)``, scaled, then rounded to the dtype;
    never zeros (METHOD: zeros hide unwritten outputs and can run faster)."""

    def __init__(self, device: torch.device, seed: int):
        self.device = device
        self.seed = seed
        self._store: dict[tuple, torch.Tensor] = {}

    def _gen(self, name: str) -> torch.Generator:
        g = torch.Generator(device=self.device)
        g.manual_seed((self.seed * 1_000_003 + sum(ord(c) * 131 ** i for i, c in enumerate(name))) % (2**63))
        return g

    def randn(self, name: str, shape: tuple[int, ...], *, scale: float = 1.0, dtype: torch.dtype = torch.bfloat16,
              offset: float = 0.0) -> torch.Tensor:
        key = ("randn", name, tuple(shape), dtype, scale, offset)
        if key not in self._store:
            x = torch.randn(tuple(shape), generator=self._gen(name), device=self.device, dtype=torch.float32)
            self._store[key] = (x * scale + offset).to(dtype)
        return self._store[key]

    def randint(self, name: str, high: int, shape: tuple[int, ...]) -> torch.Tensor:
        key = ("randint", name, tuple(shape), high)
        if key not in self._store:
            self._store[key] = torch.randint(0, high, tuple(shape), generator=self._gen(name), device=self.device,
                                             dtype=torch.int64)
        return self._store[key]

    def clear(self) -> None:
        self._store.clear()


def no_grad(fn: Callable[[], Any]) -> Callable[[], Any]:
    """``fn`` run under ``torch.no_grad()`` (forward-only timings build no autograd graph)."""

    def run():
        with torch.no_grad():
            return fn()

    return run


def grads_of(forward: Callable[[], torch.Tensor], leaves: tuple[torch.Tensor, ...],
             grad_output: torch.Tensor) -> Callable[[], tuple[torch.Tensor, ...]]:
    """Forward + backward as one callable: ``torch.autograd.grad(forward(), leaves, grad_output)``
    (no ``.grad`` accumulation between repetitions)."""

    def run():
        out = forward()
        return torch.autograd.grad(out, leaves, grad_outputs=grad_output)

    return run


def leaf(t: torch.Tensor) -> torch.Tensor:
    """A new autograd leaf sharing ``t``'s storage (no copy)."""
    return t.detach().requires_grad_(True)


def kernel_impl(op: str, backend: str) -> Callable[..., Any]:
    """The ``backend`` implementation of rl_engine op ``op``, taken from its spec directly (the
    runner checked once that the backend can run, so the per-call availability probe of
    :func:`rl_engine.backends.registry.resolve_impl` stays out of the timings)."""
    from rl_engine.errors import BackendUnavailable
    from rl_engine.ops.registry import get_spec

    impls = get_spec(op).impls
    if backend not in impls:
        raise BackendUnavailable(f"op {op} has no {backend} implementation")
    return impls[backend]
