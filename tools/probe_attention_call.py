"""Diagnostic (GPU): where the time of one prefill attention call goes, kernel against host.

For each backend and T in {2048, 8192} (one causal sequence, Qwen3-8B heads: H 32, Hkv 8, D 128), the
plain call as a user makes it (``cu_seqlens`` checked on every call): wall time per call over 50 calls,
device time per call under torch.profiler, and the host synchronisations and device-to-host copies per
call, then the profiler's table. Found (2026-12-08, H100) that each plain call reads ``cu_seqlens_q`` and
``cu_seqlens_k`` to the host (two synchronisations), which made the bench's attention rows host-bound at
2048 tokens; the bench now passes the varlen plan (``evidence/2026-12-08-h100-chain-7958a76/``).

    python3 tools/probe_attention_call.py
"""
import time

import torch
from torch.profiler import ProfilerActivity, profile

from rl_engine.bench.common import kernel_impl


def main() -> None:
    for backend in ("triton_cuda_bf16", "cuda_bf16"):
        impl = kernel_impl("attention", backend)
        for t in (2048, 8192):
            q = torch.randn(t, 32, 128, device="cuda", dtype=torch.bfloat16)
            k = torch.randn(t, 8, 128, device="cuda", dtype=torch.bfloat16)
            v = torch.randn(t, 8, 128, device="cuda", dtype=torch.bfloat16)
            cu = torch.tensor([0, t], dtype=torch.int32, device="cuda")

            def call():
                return impl(q=q, k=k, v=v, cu_seqlens_q=cu, cu_seqlens_k=cu, scale=128 ** -0.5)

            with torch.no_grad():
                for _ in range(5):
                    call()
                torch.cuda.synchronize()
                n = 50
                t0 = time.perf_counter()
                for _ in range(n):
                    call()
                torch.cuda.synchronize()
                wall = (time.perf_counter() - t0) / n * 1e3
                with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                    for _ in range(10):
                        call()
                    torch.cuda.synchronize()
            events = prof.key_averages()
            device_ms = sum(e.device_time_total for e in events if e.device_type.name == "CUDA") / 10 / 1e3
            syncs = {e.key: e.count // 10 for e in events
                     if "ynchronize" in e.key or "local_scalar" in e.key or "Memcpy" in e.key}
            print(f"{backend} T{t}: wall {wall:.3f} ms/call, device time {device_ms:.3f} ms/call, syncs/call {syncs}")
            print(events.table(sort_by="cpu_time_total", row_limit=12))


if __name__ == "__main__":
    main()
