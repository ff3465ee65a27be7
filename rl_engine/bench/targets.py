"""The performance targets, as data: this module is their one home (``docs/decisions.md``,
"Performance targets", says what they are for).

These are performance goals measured side by side in one run on one H200, never accuracy
thresholds. ``target_ratio`` is compared with the row's ``ratio`` (ours / baseline) in the
direction ``sense``: ``">="`` for rates (TFLOP/s, GB/s, tokens/s; higher is better), ``"<="`` for
time and memory (lower is better). A target applies only to the token counts in
``[tokens_min, tokens_max]`` (``None``: unbounded); rows outside carry ``target: null``.

Whole-chain rows (:mod:`rl_engine.bench.chain`, Qwen3-8B): ``chain_decode`` (one decode step)
carries ``chain.decode``; ``chain_teacher_forcing`` (forward + FP32 logprobs of every token, no
autograd) carries ``chain.teacher_forcing`` and ``chain_train_step`` (the same with backward into
every weight) ``chain.train_step`` (tokens/s) and ``chain.train_step_memory`` (peak memory, GiB),
all three against Hugging Face ``Qwen3ForCausalLM`` (sdpa) on the same weights.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class Target:
    key: str
    kernel: str
    """The target, in words."""
    baseline: str
    """What the ratio divides by (``copy`` / ``cublas`` peaks or an implementation label)."""
    target_ratio: float
    sense: str
    tokens_min: int | None = None
    tokens_max: int | None = None

    def applies(self, tokens: int) -> bool:
        lo_ok = self.tokens_min is None or tokens >= self.tokens_min
        hi_ok = self.tokens_max is None or tokens <= self.tokens_max
        return lo_ok and hi_ok

    def met(self, ratio: float) -> bool:
        return ratio >= self.target_ratio if self.sense == ">=" else ratio <= self.target_ratio

    def as_dict(self) -> dict:
        return asdict(self)


ELEMENTWISE_MIN_TOKENS = 1024
"""The rms_norm / rope / swiglu bandwidth targets were set without a shape; they are judged
from 1024 tokens up, where the tensors (16-100 MB at Qwen3-8B sizes) take several microseconds to
stream and launch latency no longer decides the rate. Smaller rows are reported without a target.
(det_gemm decode and attention decode keep their targets at every size: those targets name M = 1.)"""

TARGETS: dict[str, Target] = {t.key: t for t in (
    Target("det_gemm.prefill", "det_gemm, prefill shapes (M >= 1024) of Qwen3-8B, the forward product and "
           "both backward products", "cublas_same_shape", target_ratio=0.85, sense=">=", tokens_min=1024),
    Target("det_gemm.decode", "det_gemm, decode shapes (M <= 16): weight-read bandwidth", "copy",
           target_ratio=0.7, sense=">=", tokens_max=16),
    Target("attention.fwd", "attention forward, causal, 2k-8k tokens", "sdpa_flash",
           target_ratio=0.8, sense=">=", tokens_min=2048, tokens_max=8192),
    Target("attention.fwd_bwd", "attention forward + backward (the bench times them together), causal, "
           "2k-8k tokens", "sdpa_flash", target_ratio=0.7, sense=">=", tokens_min=2048, tokens_max=8192),
    Target("attention.decode", "attention decode with KV cache: KV-read bandwidth", "copy",
           target_ratio=0.6, sense=">="),
    Target("chain.decode", "Qwen3-8B decode step (CUDA graph): within 1.5x of the weight + KV-read bound",
           "copy", target_ratio=1 / 1.5, sense=">="),
    Target("chain.teacher_forcing", "Qwen3-8B teacher forcing (forward + FP32 logprobs of every token): tokens/s",
           "hf_sdpa", target_ratio=1.1, sense=">="),
    Target("chain.train_step", "Qwen3-8B train step (teacher forcing + backward into every weight): tokens/s",
           "hf_sdpa", target_ratio=1.0, sense=">="),
    Target("chain.train_step_memory", "Qwen3-8B train step: peak memory (scratch above the weights, less the "
           "gradients)", "hf_sdpa", target_ratio=0.7, sense="<="),
    Target("rms_norm", "rms_norm: bandwidth", "copy", target_ratio=0.85, sense=">=",
           tokens_min=ELEMENTWISE_MIN_TOKENS),
    Target("rope", "rope: bandwidth", "copy", target_ratio=0.8, sense=">=", tokens_min=ELEMENTWISE_MIN_TOKENS),
    Target("swiglu", "swiglu: bandwidth", "copy", target_ratio=0.95, sense=">=", tokens_min=ELEMENTWISE_MIN_TOKENS),
    Target("linear_logp.memory", "linear_logp fwd+bwd, 8k tokens, V = 151936: peak memory (scratch)",
           "unfused", target_ratio=1 / 16, sense="<=", tokens_min=8192),
    Target("linear_logp.time", "linear_logp fwd+bwd, 8k tokens, V = 151936: time", "unfused",
           target_ratio=1.0, sense="<=", tokens_min=8192),
)}


def target_for(key: str | None, tokens: int) -> Target | None:
    """The target named ``key`` if it applies at ``tokens``, else ``None``."""
    if key is None:
        return None
    t = TARGETS[key]
    return t if t.applies(tokens) else None
