"""Diagnostic: where the time of one prefill attention call goes (kernel vs host), the bench's call."""
import time
import torch
from rl_engine.bench.common import kernel_impl
from torch.profiler import profile, ProfilerActivity

for backend in ("triton_cuda_bf16", "cuda_bf16"):
    impl = kernel_impl("attention", backend)
    for t in (2048, 8192):
        q = torch.randn(t, 32, 128, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(t, 8, 128, device="cuda", dtype=torch.bfloat16)
        v = torch.randn(t, 8, 128, device="cuda", dtype=torch.bfloat16)
        cu = torch.tensor([0, t], dtype=torch.int32, device="cuda")
        f = lambda: impl(q=q, k=k, v=v, cu_seqlens_q=cu, cu_seqlens_k=cu, scale=128 ** -0.5)  # noqa
        with torch.no_grad():
            for _ in range(5):
                f()
            torch.cuda.synchronize()
            n = 50
            t0 = time.perf_counter()
            for _ in range(n):
                f()
            torch.cuda.synchronize()
            wall = (time.perf_counter() - t0) / n * 1e3
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as p:
                for _ in range(10):
                    f()
                torch.cuda.synchronize()
        ev = p.key_averages()
        kern = sum(e.device_time_total for e in ev if e.device_type.name == "CUDA") / 10 / 1e3
        syncs = {e.key: e.count // 10 for e in ev if "ynchronize" in e.key or "local_scalar" in e.key or "Memcpy" in e.key}
        print(f"{backend} T{t}: wall {wall:.3f} ms/call, device time {kern:.3f} ms/call, syncs/call {syncs}")
        print(p.key_averages().table(sort_by="cpu_time_total", row_limit=12))
