"""CUDA-graph capture of a step that reads no device value on the host (issue #19).

:func:`capture` runs the step once eagerly on a side stream first: Triton compiles its kernels,
the CUDA library loads and the caching allocator warms up there, none of which may happen inside
a capture. Then it records the step's launches into a :class:`torch.cuda.CUDAGraph` (recording
runs nothing). Replaying the graph re-runs those launches on the same input and output buffers,
so callers feed new values by copying into the tensors the step read when it was captured.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch


def capture(step: Callable[[], Any], *, after_warmup: Callable[[], None] | None = None,
            device: torch.device | None = None) -> tuple[torch.cuda.CUDAGraph, Any]:
    """``(graph, out)``: ``step()`` captured in a CUDA graph after one eager warm-up call, and what the
    captured call returned (tensors in the graph's memory pool, overwritten by every replay).

    ``after_warmup`` runs between the warm-up and the capture (e.g. to undo the warm-up's writes to
    state the step updates in place). Runs under ``torch.no_grad()``.
    """
    current = torch.cuda.current_stream(device)
    side = torch.cuda.Stream(device)
    side.wait_stream(current)
    with torch.no_grad():
        with torch.cuda.stream(side):
            step()
        current.wait_stream(side)
        if after_warmup is not None:
            after_warmup()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = step()
    return graph, out


def time_per_call(fn: Callable[[], Any], calls: int = 20, replays: int = 5) -> float:
    """Milliseconds per call of ``fn`` with no host work between calls: ``calls`` calls captured in
    one graph, the graph replayed ``replays`` times between CUDA events (after one untimed replay)."""
    graph, _ = capture(lambda: [fn() for _ in range(calls)])
    graph.replay()
    torch.cuda.synchronize()
    t0, t1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    t0.record()
    for _ in range(replays):
        graph.replay()
    t1.record()
    torch.cuda.synchronize()
    return t0.elapsed_time(t1) / (calls * replays)


__all__ = ["capture", "time_per_call"]
