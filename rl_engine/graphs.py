"""CUDA-graph capture of a step that reads no device value on the host (issues #19, #36).

:func:`capture` runs the step eagerly on a side stream first (``warmup_calls`` times): Triton
compiles its kernels, the CUDA libraries load their modules and create their handles, the caching
allocator grows, none of which may happen inside a capture. It then waits for the device and
records the step's launches into a :class:`torch.cuda.CUDAGraph` **on that same stream**, so
whatever a library keeps per stream (a handle's workspace, a per-stream cache) was already made by
the warm-up. Recording runs nothing. Replaying the graph re-runs those launches on the same input
and output buffers, so callers feed new values by copying into the tensors the step read when it
was captured.

A failed capture raises :class:`GraphCaptureError` with the CUDA error's text; the caller decides
whether to run the step eagerly instead (the rollout engine does, with a warning, and records it).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from rl_engine.errors import RLEngineError

WARMUP_CALLS = 2
"""Eager calls of the step before its capture. The first call compiles and loads; the second runs
the steady-state path (a cache hit everywhere), so anything set up lazily on a second call is made
before the capture too."""


class GraphCaptureError(RLEngineError, RuntimeError):
    """The CUDA graph capture of a step failed (the CUDA error text is in the message)."""


def capture(step: Callable[[], Any], *, after_warmup: Callable[[], None] | None = None,
            device: torch.device | None = None, warmup_calls: int = WARMUP_CALLS) -> tuple[torch.cuda.CUDAGraph, Any]:
    """``(graph, out)``: ``step()`` captured in a CUDA graph after ``warmup_calls`` eager calls on the
    capture's own side stream, and what the captured call returned (tensors in the graph's memory
    pool, overwritten by every replay).

    ``after_warmup`` runs between the warm-up and the capture (e.g. to undo the warm-up's writes to
    state the step updates in place). Runs under ``torch.no_grad()``.

    Raises
    ------
    GraphCaptureError
        The capture failed (e.g. ``cudaErrorStreamCaptureInvalidated``: some call during the capture
        was not capturable). The device is synchronised first, so the error is the capture's.
    """
    current = torch.cuda.current_stream(device)
    side = torch.cuda.Stream(device)
    side.wait_stream(current)
    with torch.no_grad():
        with torch.cuda.stream(side):
            for _ in range(warmup_calls):
                step()
        torch.cuda.synchronize(device)  # lazy work the warm-up started is finished before the capture
        if after_warmup is not None:
            after_warmup()
            torch.cuda.synchronize(device)
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph, stream=side):
                out = step()
        except RuntimeError as exc:
            raise GraphCaptureError(f"CUDA graph capture failed: {str(exc).strip().splitlines()[0]}") from exc
    current.wait_stream(side)
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


__all__ = ["GraphCaptureError", "WARMUP_CALLS", "capture", "time_per_call"]
