"""Timing, memory and peak measurements (GPU), and the one-call plumbing check (dry run).

Timing is ``triton.testing.do_bench``: one untimed first call (compilation, allocator warm-up),
warm-up repetitions for ``warmup_ms``, then repetitions for ``rep_ms``, each timed with CUDA
events and each preceded by a write of a 256 MB buffer that evicts the L2 cache (H200: 50 MB), so
repeated runs over one input set do not measure the cache. Reported: the median and the 20th /
80th percentiles of the per-call times.

The peaks are measured once at the start of a run and once at the end (drift check): copy
bandwidth from a 1 GiB device-to-device copy (bytes read + bytes written), and the cuBLAS BF16
rate from an 8192^3 ``torch.matmul`` on random inputs.
"""

from __future__ import annotations

import gc
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

QUANTILES = (0.5, 0.2, 0.8)
COPY_ELEMENTS = 2**29
"""BF16 elements of the copy-bandwidth buffer (1 GiB)."""
MATMUL_SIZE = 8192
"""M = N = K of the cuBLAS peak matmul."""


@dataclass(frozen=True)
class Timing:
    median_ms: float
    p20_ms: float
    p80_ms: float

    def as_dict(self) -> dict[str, float]:
        return {"median_ms": self.median_ms, "p20_ms": self.p20_ms, "p80_ms": self.p80_ms}


@dataclass(frozen=True)
class Memory:
    peak_extra_bytes: int
    result_bytes: int

    @property
    def scratch_bytes(self) -> int:
        return self.peak_extra_bytes - self.result_bytes

    def as_dict(self) -> dict[str, float]:
        return {"peak_extra_gib": self.peak_extra_bytes / 2**30, "result_gib": self.result_bytes / 2**30,
                "scratch_gib": self.scratch_bytes / 2**30}


def time_fn(fn: Callable[[], Any], warmup_ms: float, rep_ms: float) -> Timing:
    """Median and p20 / p80 of ``fn``'s time in ms (``triton.testing.do_bench``, L2 flushed per call)."""
    from triton.testing import do_bench

    med, p20, p80 = do_bench(fn, warmup=warmup_ms, rep=rep_ms, quantiles=list(QUANTILES))
    return Timing(float(med), float(p20), float(p80))


CALL_REPS = 5
"""Timed calls of a ``measure="calls"`` row (the chain rows: calls of a quarter second to one
second, whose single timed call moved by a few percent between runs on the H200,
``evidence/2026-12-04-h200-issue33-aa54b97/``)."""


def time_calls(fn: Callable[[], Any], reps: int = CALL_REPS) -> Timing:
    """Median and p20 / p80 of ``reps`` calls' times in ms after one untimed warm-up call, each call
    between its own CUDA events with a synchronisation after it (no L2 flush: calls that read
    gigabytes)."""
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        t0, t1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        t0.record()
        fn()
        t1.record()
        torch.cuda.synchronize()
        times.append(float(t0.elapsed_time(t1)))
    med, p20, p80 = (float(v) for v in torch.tensor(times, dtype=torch.float64).quantile(
        torch.tensor(QUANTILES, dtype=torch.float64)))
    return Timing(med, p20, p80)


def time_once(fn: Callable[[], Any]) -> Timing:
    """One call's time in ms after one untimed warm-up call, between CUDA events (for calls of
    seconds, such as a whole generation, where repetitions would cost minutes); p20 = p80 = median."""
    return time_calls(fn, reps=1)


def _tensors(obj: Any) -> list[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, (list, tuple)):
        return [t for o in obj for t in _tensors(o)]
    return []


def memory_fn(fn: Callable[[], Any]) -> Memory:
    """Peak allocated bytes above the starting point during one call of ``fn`` (after one warm-up
    call), and the bytes of the tensors the call returns."""
    fn()
    gc.collect()
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    out = fn()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    seen: set[int] = set()
    result = 0
    for t in _tensors(out):
        ptr = t.untyped_storage().data_ptr()
        if ptr not in seen:
            seen.add(ptr)
            result += t.untyped_storage().nbytes()
    del out
    return Memory(int(peak), int(result))


def run_once(fn: Callable[[], Any]) -> None:
    """The dry run's plumbing check: call once; the result must be (a tuple of) tensors."""
    out = fn()
    if not _tensors(out):
        raise TypeError(f"the benchmarked callable returned {type(out).__name__}, not tensors")


def measure_peaks(device: torch.device, warmup_ms: float, rep_ms: float, dry_run: bool) -> dict[str, Any]:
    """``{"copy_gbps", "cublas_tflops", ...}`` measured now (``None`` values in a dry run, where
    the same calls run once at tiny sizes)."""
    n = 4096 if dry_run else COPY_ELEMENTS
    size = 64 if dry_run else MATMUL_SIZE
    g = torch.Generator(device=device)
    g.manual_seed(1234)
    src = torch.randn((n,), generator=g, device=device, dtype=torch.float32).to(torch.bfloat16)
    dst = torch.empty_like(src)
    a = torch.randn((size, size), generator=g, device=device, dtype=torch.float32).to(torch.bfloat16)
    b = torch.randn((size, size), generator=g, device=device, dtype=torch.float32).to(torch.bfloat16)
    copy = lambda: dst.copy_(src)  # noqa: E731
    mm = lambda: a @ b  # noqa: E731
    out: dict[str, Any] = {"copy_bytes": 2 * n * 2, "matmul_mnk": [size, size, size],
                           "matmul_flops": 2 * size**3}
    if dry_run:
        run_once(copy)
        run_once(mm)
        out.update(copy_gbps=None, cublas_tflops=None, copy_spread=None, cublas_spread=None)
    else:
        tc = time_fn(copy, warmup_ms, rep_ms)
        tm = time_fn(mm, warmup_ms, rep_ms)
        out.update(copy_gbps=out["copy_bytes"] / tc.median_ms / 1e6, cublas_tflops=out["matmul_flops"] / tm.median_ms / 1e9,
                   copy_spread=tc.as_dict(), cublas_spread=tm.as_dict())
    del src, dst, a, b
    return out
