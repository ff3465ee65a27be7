"""Op specs: what the gate needs to know about one op.

Shape glossary (one notation everywhere): B batch, S sequence, T packed tokens, E hidden,
F ffn, H query heads, Hkv KV heads, D head dim, V vocab, M/N/K GEMM sizes.

An op folder ``rl_engine/ops/<op>/`` provides ``SPEC: OpSpec``. Each implementation is a callable
``impl(**inputs)`` that returns one tensor or a tuple of tensors (named by ``OpSpec.outputs``).
The reference receives the same BF16 input values upcast to FP32 (the gate upcasts them), runs
under :func:`rl_engine.ops.reference_guard.fp32_reference_guard`, and returns FP32.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from rl_engine.ops._draw import normal_fp64_as_fp32

TRANSFORMS = ("batch", "chunk", "padding", "layout", "tp")
BACKEND_NAMES = ("reference_fp32", "torch_bf16", "triton_cuda_bf16", "cuda_bf16")


@dataclass(frozen=True)
class Workload:
    """Named input shapes. ``smoke`` runs on a 2-core CPU; ``qwen3-8b`` is the Qwen3-8B target."""

    name: str
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    vocab: int
    rope_theta: float
    rms_norm_eps: float
    token_counts: tuple[int, ...]
    """Packed token counts of the row-wise accuracy cases (always includes 1 and an odd size)."""
    seq_lens: tuple[int, ...]
    """Sequence lengths of one varlen batch (attention, pack)."""
    grad_token_count: int
    """Token count of the gradient cases."""

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


WORKLOADS: dict[str, Workload] = {
    "smoke": Workload(
        name="smoke", hidden=64, heads=4, kv_heads=2, head_dim=32, ffn=96, vocab=1000,
        rope_theta=1e6, rms_norm_eps=1e-6, token_counts=(1, 7, 33), seq_lens=(1, 0, 13, 20),
        grad_token_count=9,
    ),
    "qwen3-8b": Workload(
        name="qwen3-8b", hidden=4096, heads=32, kv_heads=8, head_dim=128, ffn=12288, vocab=151936,
        rope_theta=1e6, rms_norm_eps=1e-6, token_counts=(1, 257, 4096), seq_lens=(1, 255, 0, 1024, 2817),
        grad_token_count=1027,
    ),
}


def get_workload(name: str) -> Workload:
    from rl_engine.errors import RLEngineError

    if name not in WORKLOADS:
        raise RLEngineError(f"unknown workload {name!r}; valid: {', '.join(WORKLOADS)}")
    return WORKLOADS[name]


@dataclass
class Case:
    """One input set for an op: BF16 tensors (and int tensors / Python scalars)."""

    id: str
    inputs: dict[str, Any]
    seed: int


@dataclass(frozen=True)
class Pair:
    """Two tensors an invariance check compares bit for bit."""

    label: str
    canonical: torch.Tensor
    transformed: torch.Tensor


TransformFn = Callable[[Callable[..., Any], "Case", str, bool], list[Pair]]
"""``fn(impl, case, direction, plant) -> pairs``; ``direction`` is ``forward`` or ``gradient``.
With ``plant=True`` the transformed side carries a planted one-ulp change (the negative control)."""


@dataclass
class OpSpec:
    """Everything the gate needs about one op."""

    name: str
    summary: str
    build_cases: Callable[[Workload, int, torch.device], list[Case]]
    """Accuracy cases: ``build_cases(workload, seed, device)``."""
    build_grad_cases: Callable[[Workload, int, torch.device], list[Case]] | None
    """Gradient cases (``None`` when no input takes a gradient)."""
    outputs: tuple[str, ...]
    grad_inputs: tuple[str, ...]
    """Inputs that take gradients (empty: gradient cells are N/A with ``no_grad_reason``)."""
    impls: dict[str, Callable[..., Any]]
    """Backend name -> callable. Must hold ``reference_fp32`` and ``torch_bf16``."""
    transforms: dict[str, TransformFn | str]
    """Transform name -> function, or a string: the reason the transform is N/A for this op."""
    no_grad_reason: str | None = None
    controls: dict[str, Callable[..., Any]] = field(default_factory=dict)
    """Optional known-breaking implementations per transform (size-dependent tile configs etc.)."""
    float_outputs_fp32: tuple[str, ...] = ()
    """Outputs that are FP32 on every backend (logprobs, FP32 logits)."""

    def transform(self, name: str) -> TransformFn | str:
        if name not in TRANSFORMS:
            raise KeyError(f"unknown transform {name!r}; transforms: {TRANSFORMS}")
        return self.transforms.get(name, "not declared by the op spec")


def as_tuple(out: Any) -> tuple[torch.Tensor, ...]:
    """Normalise an implementation's return value to a tuple of tensors."""
    if isinstance(out, torch.Tensor):
        return (out,)
    return tuple(out)


def make_generator(seed: int, device: torch.device | str = "cpu") -> torch.Generator:
    g = torch.Generator(device="cpu")
    g.manual_seed(seed)
    return g


def standard_normal(shape: Sequence[int], generator: torch.Generator) -> torch.Tensor:
    """Seeded standard normal FP32 values ``[*shape]`` on the generator's device, the same bits on
    every host.

    A CPU generator draws in FP64 and rounds once to FP32: PyTorch's FP32 CPU normal sampler has a
    vectorised AVX2 path and a scalar one (DEFAULT and, by its source, AVX-512 builds) that give
    different values for one seed, while its FP64 sampler is the same on both
    (``docs/cpu-interpreter.md``). Large draws run on several cores with the same bits
    (:mod:`rl_engine.ops._draw`). A CUDA generator (Philox) draws FP32 directly.
    """
    if generator.device.type == "cpu":
        return normal_fp64_as_fp32(shape, generator)
    return torch.randn(tuple(shape), generator=generator, dtype=torch.float32, device=generator.device)


def randn(shape: Sequence[int], seed_gen: torch.Generator, *, scale: float = 1.0,
          dtype: torch.dtype = torch.bfloat16, device: torch.device | str = "cpu") -> torch.Tensor:
    """Seeded normal values drawn on the CPU (:func:`standard_normal`), scaled in FP32, rounded to
    ``dtype``, moved to device. Drawing on the CPU keeps inputs identical on every machine for one seed.
    """
    x = standard_normal(shape, seed_gen) * scale
    return x.to(dtype).to(device)


def randint(high: int, shape: Sequence[int], seed_gen: torch.Generator,
            device: torch.device | str = "cpu") -> torch.Tensor:
    return torch.randint(0, high, tuple(shape), generator=seed_gen, dtype=torch.int64).to(device)
