"""PyTorch's FP64 CPU normal draw, on several cores, with the same bits as one ``torch.randn`` call.

Why: the case inputs are drawn in FP64 on the CPU and rounded once to FP32
(:func:`rl_engine.ops.spec.standard_normal`, ``docs/cpu-interpreter.md``), and PyTorch's FP64
sampler runs on one core. At Qwen3-8B sizes (an LM-head weight is 622 M values) one draw took
tens of seconds, several times per gate run.

How, from PyTorch's CPU kernel (``normal_fill`` in ATen's ``DistributionTemplates.h``): a draw of
``n >= 16`` contiguous FP64 values first takes ``n`` uniforms from the generator's Mersenne
Twister in order (one 64-bit output each, the same stream ``torch.rand(..., dtype=float64)``
takes), then applies Box-Muller to each block of 16 (values ``j`` and ``j + 8`` of a block form one
pair); when ``n % 16 != 0`` it takes 16 more uniforms and recomputes the last 16 values from them.
So a draw split into chunks whose sizes are multiples of 16 (the last one at least 16 long, with
the same remainder) gives the same values, provided chunk ``i`` starts from the generator state
after the uniforms of chunks ``0..i-1``. The states are found in order by drawing the uniforms of
each chunk (``torch.rand``, about a third of the cost of ``torch.randn``); the Box-Muller work of
the chunks then runs on threads (ATen releases the GIL), each with its own generator set to its
chunk's state. The caller's generator ends in the state a single draw leaves it in.

``tests/ops/test_draw.py`` checks values and the final state against one ``torch.randn`` call.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

import torch

CHUNK = 1 << 21
"""Values per chunk (a multiple of 16)."""
BLOCK = 16
"""PyTorch's Box-Muller block: a draw of fewer values takes another (serial) path."""


def chunk_sizes(n: int) -> list[int]:
    """Sizes of the chunks a draw of ``n`` values is split into: ``CHUNK`` each, the rest in the
    last chunk, which is merged with the one before it when it would be shorter than ``BLOCK``."""
    sizes = [CHUNK] * (n // CHUNK)
    rest = n - CHUNK * len(sizes)
    if rest:
        if rest < BLOCK and sizes:
            sizes[-1] += rest
        else:
            sizes.append(rest)
    return sizes


def _workers() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


def normal_fp64_as_fp32(shape: Sequence[int], generator: torch.Generator) -> torch.Tensor:
    """``torch.randn(shape, generator=generator, dtype=torch.float64).to(torch.float32)`` with
    the same bits and the same final generator state, drawn on several CPU threads.

    ``generator`` must be a CPU generator. Output ``[*shape]`` FP32 on the CPU.
    """
    n = math.prod(shape)
    if n < 2 * CHUNK or _workers() == 1:
        return torch.randn(tuple(shape), generator=generator, dtype=torch.float64).to(torch.float32)
    sizes = chunk_sizes(n)
    out = torch.empty(n, dtype=torch.float32)
    scratch = torch.empty(max(sizes) + BLOCK, dtype=torch.float64)

    def draw(start: int, size: int, state: torch.Tensor) -> None:
        g = torch.Generator(device="cpu")
        g.set_state(state)
        out[start:start + size] = torch.randn(size, generator=g, dtype=torch.float64)

    with ThreadPoolExecutor(_workers()) as pool:
        futures, start = [], 0
        for size in sizes:
            futures.append(pool.submit(draw, start, size, generator.get_state()))
            taken = size if size % BLOCK == 0 else size + BLOCK  # the re-drawn last block
            torch.rand(taken, generator=generator, dtype=torch.float64, out=scratch[:taken])
            start += size
        for f in futures:
            f.result()
    return out.reshape(tuple(shape))
