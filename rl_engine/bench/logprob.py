"""Logprob benchmarks: ``linear_logp`` forward + backward (time and peak memory).

``linear_logp(hidden [T, E], weight [V, E], targets [T])`` -> FP32 logprobs ``[T]``, then the
gradients of ``sum(logprobs)`` (an all-ones upstream gradient, the same for every
implementation) with respect to hidden and weight, as one callable.

Baselines:

- unfused: ``logits = hidden @ weight.T`` (cuBLAS, BF16), ``.float()``, ``log_softmax``,
  ``gather`` — the Hugging Face way to FP32 logprobs — and its autograd backward;
- Liger-Kernel ``LigerFusedLinearCrossEntropyFunction`` (``reduction="none"``, logprob = -loss),
  where ``liger_kernel`` imports. Liger computes the gradients inside its forward.

Two rows per shape and backend: time (ms, median; target <= 1.0x unfused at 8k tokens) and
memory (GiB; target <= 1/16 of unfused at 8k tokens). Memory is measured on one call after a
warm-up call: ``peak allocated - allocated before``; the row value ("scratch") subtracts the bytes
of the gradients the call returns (dhidden ``[T, E]`` and dweight ``[V, E]`` BF16, which every
implementation must produce), and the raw peak is kept in the row's ``memory`` field. Memory
allocated outside PyTorch's caching allocator is not seen.
"""

from __future__ import annotations

import torch

from rl_engine.bench import counts
from rl_engine.bench.common import Baseline, Case, grads_of, kernel_impl, leaf


def _build(s, d, pool):
    t, e, v = s["T"], s["E"], s["V"]
    hidden = pool.randn("hidden", (t, e))
    weight = pool.randn("lm_head.weight", (v, e), scale=e ** -0.5)
    targets = pool.randint("targets", v, (t,))
    ones = hidden.new_ones((t,), dtype=torch.float32)
    return {"hidden": hidden, "weight": weight, "targets": targets, "g": ones}


def _ours(backend, st):
    impl = kernel_impl("linear_logp", backend)
    h, w, tg = leaf(st["hidden"]), leaf(st["weight"]), st["targets"]
    return grads_of(lambda: impl(hidden=h, weight=w, targets=tg), (h, w), st["g"])


def _unfused(st):
    h, w, tg = leaf(st["hidden"]), leaf(st["weight"]), st["targets"]

    def forward():
        logits = (h @ w.t()).float()
        return logits.log_softmax(-1).gather(-1, tg.unsqueeze(-1)).squeeze(-1)

    return grads_of(forward, (h, w), st["g"])


def _liger(st):
    from liger_kernel.ops.fused_linear_cross_entropy import LigerFusedLinearCrossEntropyFunction

    h, w, tg = leaf(st["hidden"]), leaf(st["weight"]), st["targets"]

    def forward():
        loss = LigerFusedLinearCrossEntropyFunction.apply(h, w, tg, None, None, -100, 0.0, 0.0, "none")
        loss = loss[0] if isinstance(loss, tuple) else loss
        return -loss.float()

    return grads_of(forward, (h, w), st["g"])


def _case(tokens: int, measure: str) -> Case:
    time = measure == "time"
    return Case(
        op="linear_logp", family="logprob", kernel_op="linear_logp", variant="fwd+bwd " + ("time" if time else "memory"),
        tokens=tokens, metric="ms" if time else "GiB", measure=measure,
        sizes=lambda d, t: {"T": t, "E": d.hidden, "V": d.vocab},
        label=lambda s: f"T{s['T']}-E{s['E']}-V{s['V']}",
        count=lambda s: (counts.linear_logp_flops(s["T"], s["E"], s["V"]),
                         counts.linear_logp_bytes(s["T"], s["E"], s["V"])),
        build=_build, ours=_ours,
        baselines=[Baseline("unfused lm_head + log_softmax + gather", make=_unfused, primary=True,
                            target="linear_logp.time" if time else "linear_logp.memory"),
                   Baseline("Liger-Kernel fused linear cross-entropy", make=_liger, requires="liger_kernel",
                            needs_cuda=True)])


OPS = ("linear_logp",)


def cases(op: str, tokens: list[int], quick: bool) -> list[Case]:
    if op != "linear_logp":
        raise KeyError(op)
    return [_case(t, m) for t in tokens for m in ("time", "memory")]
