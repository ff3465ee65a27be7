"""Where a Qwen3-8B training step spends its GPU time (issue #33): torch.profiler over teacher
forcing (forward + FP32 logprobs, no autograd) and the train step (the same with autograd, the
sum of the logprobs as loss, backward into every weight), per kernel name and per op family.

Synthetic Qwen3-8B weights (``rl_engine.chain.weights.synthetic_weights``), ``--batch`` packed
sequences of ``--seq-len`` random tokens (cu_seqlens), every token scored against the next one of
its sequence. Prints wall time per call (CUDA events, after ``--warmup`` calls), the summed kernel
time, and the kernels by total time; ``--json`` writes the same. Ours runs the bench's table,
:meth:`Qwen3Model.training_ops` (residual adds fused into the norms, QK-norm fused with RoPE); with ``--plain`` the model's
own table is timed too. With ``--hf`` the same calls on Hugging Face ``Qwen3ForCausalLM`` (sdpa)
over the same weight tensors are timed and profiled too.

Usage on the H200::

    python tools/train_step_profile.py --backend triton_cuda_bf16 --batch 4 --seq-len 1024 --hf --json prof.json
"""

from __future__ import annotations

import argparse
import json
import time
from collections import defaultdict

import torch


def family(name: str) -> str:
    n = name.lower()
    for key, fam in (("det_gemm", "det_gemm"), ("gemm", "gemm"), ("nvjet", "gemm"), ("cutlass", "gemm"),
                     ("sm90_xmma", "gemm"), ("attn", "attention"), ("flash", "attention"), ("fmha", "attention"),
                     ("linear_logp", "logprob"), ("logp", "logprob"), ("_fwd_partial", "logprob"),
                     ("_fwd_combine", "logprob"), ("_bwd_dlogits", "logprob"), ("_bwd_dhidden", "logprob"),
                     ("_bwd_dweight", "logprob"), ("lm_head", "lm_head"),
                     ("rms", "norm"), ("_dw_reduce", "norm"), ("norm", "norm"), ("rope", "rope"), ("swiglu", "swiglu"), ("silu", "swiglu"),
                     ("embedding", "embedding"), ("softmax", "softmax"), ("elementwise", "elementwise"),
                     ("reduce", "reduce"), ("copy", "copy"), ("cat", "copy"), ("index", "index")):
        if key in n:
            return fam
    return "other"


HOST_SYNC_EVENTS = ("aten::_local_scalar_dense", "cudaStreamSynchronize", "cudaDeviceSynchronize",
                   "cudaEventSynchronize")
"""CPU-side profiler events of a host waiting on the GPU (``.item()``, ``int(t)``, ``.tolist()`` of a
CUDA tensor and explicit synchronisations); the profile counts them per call, including the one
``torch.cuda.synchronize()`` that closes the profiled call (and the profiler's own)."""


def build_inputs(cfg, batch: int, seq_len: int, device):
    g = torch.Generator(device=device).manual_seed(batch * 1009 + seq_len)
    ids = torch.randint(0, cfg.vocab_size, (batch, seq_len), generator=g, device=device)
    targets = torch.roll(ids, -1, dims=1)  # the last row of a sequence scores its first token
    return ids, targets


def ours(weights, backend: str, ids, targets, train: bool, plain: bool = False, packed: bool = False):
    """The chain's call; ``plain``: the model's own table (separate residual adds, norms and rotations) instead of
    :meth:`Qwen3Model.training_ops` (the bench's); ``packed``: teacher forcing over the stacked q/k/v and gate/up
    weights (``forward(packed=True)``, the rollout engine's form; no-grad calls only)."""
    if packed and train:
        raise SystemExit("--packed: teacher forcing only (the stacked weights carry no gradients)")
    from rl_engine.chain.model import Qwen3Model

    model = Qwen3Model(weights, backend)
    ops = None if plain else model.training_ops()
    b, s = ids.shape
    dev = ids.device
    flat, tflat = ids.reshape(-1), targets.reshape(-1)
    positions = torch.arange(s, device=dev).repeat(b)
    cu = torch.arange(0, b * s + 1, s, dtype=torch.int32, device=dev)
    params = [t for _, t in weights.named_tensors()]
    model.check_positions(0, s - 1)  # once, on the host, as the bench's chain rows do

    def call():
        if train:
            hidden = model.forward(flat, positions, cu_seqlens=cu, checked=True, ops=ops)
            lp = model.logprobs(hidden, tflat)
            lp.sum().backward()
            for p in params:
                p.grad = None
            return lp.detach()
        with torch.no_grad():
            return model.logprobs(model.forward(flat, positions, cu_seqlens=cu, checked=True, ops=ops, packed=packed),
                                  tflat)

    return call


def hf(weights, ids, targets, train: bool):
    from rl_engine.bench.chain import hf_causal_lm

    model = hf_causal_lm(weights, train=train)
    params = list(model.parameters())  # Parameters sharing the weights' storage: their .grad is what backward sets

    def logprobs():
        logits = model(input_ids=ids, use_cache=False).logits
        return torch.log_softmax(logits.float(), -1).gather(-1, targets[..., None])[..., 0]

    def call():
        if train:
            lp = logprobs()
            lp.sum().backward()
            for p in params:
                p.grad = None
            return lp.detach()
        with torch.no_grad():
            return logprobs()

    return call


def measure(call, warmup: int, reps: int, top: int, gradient_bytes: int = 0, cpu_top: int = 0,
            profiled_calls: int = 1) -> dict:
    """Wall time per call, kernel time by name and family, and the scratch peak (allocated above the
    start); ``gradient_bytes`` (the train step's BF16 gradients, held at the peak) is also
    subtracted in ``scratch_less_gradients_gib``, the quantity of the bench's memory target.
    ``host_ms``: the host's time to enqueue one call (it also approaches ``wall_ms`` when the launch
    queue fills and the host waits for the GPU, so ``idle_before`` is the measure of a launch-bound
    call: GPU idle time between kernels, with no host sync inside);
    ``cpu_top``: the host events with the most self time in the profiled call (under the profiler,
    which slows the host); ``profiled_calls``: calls back to back under the profiler (kernel, host
    and idle times and counts are per call; the longest gaps cover them all, so a second call
    shows the GPU idle between two calls)."""
    for _ in range(warmup):
        call()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    t0, t1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    t0.record()
    h0 = time.perf_counter()
    for _ in range(reps):
        call()
    host = (time.perf_counter() - h0) * 1e3 / reps  # the host's time to enqueue a call (no sync inside)
    t1.record()
    torch.cuda.synchronize()
    wall = t0.elapsed_time(t1) / reps
    peak = (torch.cuda.max_memory_allocated() - base) / 2**30
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(profiled_calls):
            call()
        torch.cuda.synchronize()
    kernels: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    syncs: dict[str, int] = defaultdict(int)  # host reads of device values: each stalls the launch queue
    spans = []
    for ev in prof.events():
        if ev.device_type == torch.autograd.DeviceType.CUDA:
            k = kernels[ev.name]
            k[0] += ev.device_time_total / 1000.0 / profiled_calls
            k[1] += 1
            spans.append((ev.time_range.start, ev.time_range.end, ev.name))
        elif ev.name in HOST_SYNC_EVENTS:
            syncs[ev.name] += 1
    fams: dict[str, float] = defaultdict(float)
    for name, (ms, _n) in kernels.items():
        fams[family(name)] += ms
    ranked = sorted(kernels.items(), key=lambda kv: -kv[1][0])
    # GPU idle time between kernels, filed under the kernel that ends the gap: with no host sync
    # in the call, a gap means the host had not launched that kernel yet (a launch-bound stretch).
    spans.sort()
    idle: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    busy_until = spans[0][1] if spans else 0.0
    for start, end, name in spans[1:]:
        if start > busy_until:
            g = idle[name[:80]]
            g[0] += (start - busy_until) / 1000.0 / profiled_calls
            g[1] += 1
        busy_until = max(busy_until, end)
    idle_ranked = sorted(idle.items(), key=lambda kv: -kv[1][0])
    # first kernel start to last kernel end (per profiled call): what the wall time has beyond it
    # is GPU idle outside the kernels (host work before the first launch or after a sync at the end)
    span = (max(e for _s, e, _n in spans) - spans[0][0]) / 1000.0 / profiled_calls if spans else 0.0
    # the longest single gaps, with the kernels on either side and where in the call they fall
    gaps, end, prev = [], spans[0][1] if spans else 0.0, spans[0][2] if spans else ""
    for start, stop, name in spans[1:]:
        if start > end:
            gaps.append(((start - end) / 1000.0, (end - spans[0][0]) / 1000.0, prev[:60], name[:60]))
        if stop > end:
            end, prev = stop, name
    gaps.sort(reverse=True)
    cpu = [(e.key, e.self_cpu_time_total / 1000.0 / profiled_calls, round(e.count / profiled_calls))
           for e in prof.key_averages()]
    cpu.sort(key=lambda r: -r[1])
    return {"wall_ms": wall, "host_ms": host, "cpu_self_ms": sum(r[1] for r in cpu),
            "cpu_top": [{"event": k[:120], "self_ms": ms, "calls": n} for k, ms, n in cpu[:cpu_top]],
            "gpu_idle_ms": sum(v[0] for v in idle.values()), "kernel_span_ms": span,
            "longest_gaps": [{"ms": g, "at_ms": at, "after": a, "before": b} for g, at, a, b in gaps[:top]],
            "idle_before": [{"kernel": n, "ms": v[0], "gaps": round(v[1] / profiled_calls)}
                            for n, v in idle_ranked[:top]],
            "kernel_ms": sum(v[0] for v in kernels.values()),
            "launches": round(sum(v[1] for v in kernels.values()) / profiled_calls), "scratch_peak_gib": peak,
            "scratch_less_gradients_gib": peak - gradient_bytes / 2**30,
            "families_ms": dict(sorted(fams.items(), key=lambda kv: -kv[1])),
            "host_syncs": {k: round(v / profiled_calls) for k, v in syncs.items()},
            "top": [{"kernel": n[:160], "ms": v[0], "calls": round(v[1] / profiled_calls)} for n, v in ranked[:top]]}


def sync_sites(call, label: str) -> None:
    """One call under ``torch.cuda.set_sync_debug_mode("warn")``: every operation that makes the host
    wait for the GPU (a read of a device value, a synchronising copy or allocation), counted by the
    Python line that issued it. After such a wait the launch queue is empty and the GPU idles
    until the host has launched the next kernel."""
    import warnings

    torch.cuda.synchronize()
    sites: dict[str, int] = defaultdict(int)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            call()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()
    for w in caught:  # a warning raised in C++ points at the Python line that called the operation
        sites[f"{str(w.message).splitlines()[0][:60]} @ {w.filename.rsplit('/', 2)[-1]}:{w.lineno}"] += 1
    print(f"== {label}: host waits for the GPU in one call (sync debug mode), by site")
    for site, n in sorted(sites.items(), key=lambda kv: -kv[1]):
        print(f"   {n:4d}x  {site}")


def python_profile(call, top: int, label: str) -> None:
    """One call under cProfile (after ``measure``'s warm-up): the Python functions with the most own
    time, i.e. where the host spends a launch-bound stretch (validation, launchers, dispatch)."""
    import cProfile
    import io
    import pstats

    torch.cuda.synchronize()
    prof = cProfile.Profile()
    prof.enable()
    call()
    prof.disable()
    torch.cuda.synchronize()
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(top)
    print(f"== {label}: cProfile, one call, by own time")
    print("\n".join(line for line in out.getvalue().splitlines() if line.strip())[:12000])


def report(label: str, r: dict, tokens: int) -> None:
    print(f"== {label}: {r['wall_ms']:.1f} ms/call ({tokens / r['wall_ms'] * 1e3:.0f} tok/s), kernels "
          f"{r['kernel_ms']:.1f} ms in {r['launches']} launches, scratch peak {r['scratch_peak_gib']:.1f} GiB "
          f"({r['scratch_less_gradients_gib']:.1f} GiB less the gradients)")
    print("   families: " + ", ".join(f"{k} {v:.1f}" for k, v in r["families_ms"].items()))
    print("   host syncs: " + (", ".join(f"{k} {v}" for k, v in r["host_syncs"].items()) or "none"))
    print(f"   host: {r['host_ms']:.1f} ms to enqueue a call; profiled host self time {r['cpu_self_ms']:.1f} ms")
    for t in r["cpu_top"]:
        print(f"   host {t['self_ms']:8.2f} ms {t['calls']:5d}x  {t['event']}")
    print(f"   GPU idle between kernels (profiled call): {r['gpu_idle_ms']:.1f} ms; first kernel start to last "
          f"kernel end {r['kernel_span_ms']:.1f} ms")
    for t in r["idle_before"]:
        print(f"   idle {t['ms']:8.2f} ms {t['gaps']:5d} gaps before  {t['kernel']}")
    for t in r["longest_gaps"][:10]:
        print(f"   gap {t['ms']:8.3f} ms at {t['at_ms']:7.1f} ms: after {t['after']} / before {t['before']}")
    for t in r["top"]:
        print(f"   {t['ms']:8.2f} ms {t['calls']:5d}x  {t['kernel']}")


def with_persistent_tiles(text: str, make):
    """``make`` whose calls run the persistent det_gemm in configuration ``text`` (the sweep's
    syntax): the module's configuration is swapped around each call and restored after it."""
    from det_gemm_prefill_sweep import parse_config  # tools/ is the script's directory

    from rl_engine.ops.det_gemm import triton as det_gemm_triton

    tiles = parse_config(text)

    def configured():
        call = make()

        def run():
            default = det_gemm_triton.PERSISTENT_TILES
            det_gemm_triton.PERSISTENT_TILES = tiles
            try:
                return call()
            finally:
                det_gemm_triton.PERSISTENT_TILES = default

        return run

    return configured


def with_cuda_forms(text: str, make):
    """``make`` whose calls run the cuda_bf16 backend's training-size GEMMs in form ``text``'s number
    (``rl_engine.ops.det_gemm.cuda.TREE_GEMM_FORMS``), with a ``t`` in the suffix linear_logp's
    tensor-core backward (``TENSOR_CORE_BWD_ON_CUDA``, else its FP32 one) and with an ``a`` the
    attention backward's tensor-core form, with a ``d`` its declared form (the default since
    ws1-c1-v8; ``attention.cuda.BWD_FORMS``), else ``fma``, e.g. ``3ta``, ``4td``; with an ``s`` the
    one-launch gate / up + SwiGLU of teacher forcing (``det_gemm.cuda.GATE_UP_SWIGLU_FUSED``), e.g.
    ``5tds``; all are set around each call and restored after it."""
    from rl_engine.ops.attention import cuda as attention_cuda
    from rl_engine.ops.det_gemm import cuda as det_gemm_cuda
    from rl_engine.ops.linear_logp import cuda as linear_logp_cuda

    digits, suffix = text.rstrip("tads"), text.lstrip("0123456789")
    if not digits.isdigit() or digits + suffix != text or ("a" in suffix and "d" in suffix):
        raise SystemExit(f"--cuda-forms: {text!r}: a form number, then t, s and / or one of a, d")
    form = int(digits)
    tc = "t" in suffix
    swiglu = "s" in suffix
    attn = "declared" if "d" in suffix else ("tensor_cores" if "a" in suffix else "fma")

    def configured():
        call = make()

        def run():
            old_form = det_gemm_cuda.set_tree_gemm_form(form)
            old_tc = linear_logp_cuda.TENSOR_CORE_BWD_ON_CUDA
            old_attn = attention_cuda.set_bwd_form(attn)
            old_swiglu = det_gemm_cuda.GATE_UP_SWIGLU_FUSED
            linear_logp_cuda.TENSOR_CORE_BWD_ON_CUDA = tc
            det_gemm_cuda.GATE_UP_SWIGLU_FUSED = swiglu
            try:
                return call()
            finally:
                det_gemm_cuda.set_tree_gemm_form(old_form)
                linear_logp_cuda.TENSOR_CORE_BWD_ON_CUDA = old_tc
                attention_cuda.set_bwd_form(old_attn)
                det_gemm_cuda.GATE_UP_SWIGLU_FUSED = old_swiglu

        return run

    return configured


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backend", default="triton_cuda_bf16")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq-len", type=int, default=1024)
    ap.add_argument("--modes", default="teacher_forcing,train_step")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--top", type=int, default=20)
    ap.add_argument("--cpu-top", type=int, default=0, help="also list this many host events by self time")
    ap.add_argument("--cprofile", type=int, default=0,
                    help="also run one call of ours under cProfile and list this many Python functions by own time")
    ap.add_argument("--profiled-calls", type=int, default=1,
                    help="calls back to back under the profiler (2 shows the GPU idle between calls)")
    ap.add_argument("--sync-sites", action="store_true",
                    help="also run one call of ours in sync debug mode and list where the host waits for the GPU")
    ap.add_argument("--hf", action="store_true", help="also Hugging Face Qwen3ForCausalLM (sdpa), same weights")
    ap.add_argument("--plain", action="store_true",
                    help="also the model's own op table (separate residual adds, norms and rotations) beside training_ops "
                         "(label <backend>/plain)")
    ap.add_argument("--persistent-configs", default="",
                    help="also ours with the persistent det_gemm in each of these configurations (comma-separated, "
                         "tools/det_gemm_prefill_sweep.py's syntax; label <backend>@<config>), in the same process")
    ap.add_argument("--cuda-forms", default="",
                    help="also ours with the cuda_bf16 GEMM form N of det_gemm.cuda.TREE_GEMM_FORMS (suffix t: and "
                         "linear_logp's tensor-core backward; a: and the attention backward's tensor-core form; d: its declared "
                         "form, the default), "
                         "comma-separated, e.g. 3t,3ta (label <backend>#<form>); for --backend cuda_bf16")
    ap.add_argument("--calls-only", type=int, default=0,
                    help="run each call this many times with no profiler and no timing, then stop (for ncu, which "
                         "picks its kernels by name: tools/h200_issue33.sh's NCU_KERNELS)")
    ap.add_argument("--packed", action="store_true",
                    help="teacher forcing over a second copy of the weights with q/k/v and gate/up stacked "
                         "(forward(packed=True): where the cuda_bf16 one-launch gate / up + SwiGLU, --cuda-forms "
                         "suffix s, can run); the copy is freed before the train step")
    ap.add_argument("--json", default=None)
    ap.add_argument("--no-persistent", action="store_true",
                    help="Triton det_gemm without its persistent TMA form (the fused form, as before issue #33)")
    args = ap.parse_args(argv)
    if args.no_persistent:
        from rl_engine.ops.det_gemm import triton as det_gemm_triton

        det_gemm_triton.PERSISTENT_ON_CUDA = False
    if not torch.cuda.is_available():
        raise SystemExit("needs a CUDA GPU")
    from rl_engine.chain.config import get_config
    from rl_engine.chain.weights import synthetic_weights

    cfg = get_config("qwen3-8b")
    weights = synthetic_weights(cfg, 0, logit_scale=2.0, device="cuda")
    for _, t in weights.named_tensors():
        t.requires_grad_(True)
    ids, targets = build_inputs(cfg, args.batch, args.seq_len, torch.device("cuda"))
    tokens = args.batch * args.seq_len
    out = {"backend": args.backend, "batch": args.batch, "seq_len": args.seq_len,
           "persistent_det_gemm": not args.no_persistent, "results": {}}
    for mode in args.modes.split(","):
        train = mode == "train_step"
        packed = args.packed and not train
        # the stacked copy (pack_projections re-points its fields): the trained weights stay as they are
        w = synthetic_weights(cfg, 0, logit_scale=2.0, device="cuda") if packed else weights
        if packed:
            print(f"== {mode}: q/k/v and gate/up stacked (forward(packed=True)) on a copy of the weights")

        def mine(plain=False, w=w, train=train, packed=packed):
            return ours(w, args.backend, ids, targets, train, plain=plain, packed=packed)

        impls = {args.backend: mine}
        if args.plain:
            impls[f"{args.backend}/plain"] = lambda: mine(plain=True)
        for text in filter(None, args.persistent_configs.split(",")):
            impls[f"{args.backend}@{text}"] = with_persistent_tiles(text, mine)
        for text in filter(None, args.cuda_forms.split(",")):
            impls[f"{args.backend}#{text}"] = with_cuda_forms(text, mine)
        if args.hf:
            impls["hf_sdpa"] = lambda: hf(weights, ids, targets, train)
        for label, make in impls.items():
            if args.calls_only:
                call = make()
                for _ in range(args.calls_only):
                    call()
                torch.cuda.synchronize()
                print(f"== {mode}/{label}: {args.calls_only} call(s), not timed")
                continue
            try:
                grads = sum(t.numel() * 2 for _, t in weights.named_tensors()) if train else 0
                call = make()
                r = measure(call, args.warmup, args.reps, args.top, grads, args.cpu_top, args.profiled_calls)
                if args.sync_sites and label == args.backend:
                    sync_sites(call, f"{mode}/{label}")
                if args.cprofile and label == args.backend:
                    python_profile(call, args.cprofile, f"{mode}/{label}")
            except torch.cuda.OutOfMemoryError as exc:
                r = {"error": f"OutOfMemoryError: {str(exc)[:200]}"}
                torch.cuda.empty_cache()
            out["results"][f"{mode}/{label}"] = r
            if "error" in r:
                print(f"== {mode}/{label}: {r['error']}")
            else:
                report(f"{mode}/{label}", r, tokens)
            torch.cuda.empty_cache()
        del w, impls, mine
        torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(out, fh, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
