"""Batch-invariant sampling on the device: counter-based Gumbel-max with deterministic top-k / top-p.

Shape glossary: B rows (sequences in one step), V vocab.

The sampling distribution of a row with FP32 logits ``z`` [V] is defined in ``docs/rollout.md``
("Sampling definition"); in short:

1. ``s = z / temperature`` in FP32 (one IEEE division per entry, the same operation the ``logp``
   kernel performs, docs/pitfalls.md P11).
2. **Order**: tokens ranked by ``s`` descending, ties by the lower token id (a stable sort).
3. **top-k**: keep the first ``top_k`` ranks (exactly ``min(top_k, V)`` tokens).
4. **top-p** (nucleus, Holtzman et al. 2019, "The Curious Case of Neural Text Degeneration"): on
   the top-k set, weights ``w_r = exp(s_r - s_0)`` (float64) summed in rank order; rank ``r`` is kept
   when the mass of the ranks before it is ``< top_p * total``: the smallest prefix whose mass reaches
   ``top_p`` (rank 0 is always kept). ``top_p = 1`` means no top-p filter at all.
5. The sampling distribution is ``softmax(s)`` restricted to the kept set and renormalised; the
   logprob of the drawn token is the ``logp`` op of the project on the logits with every dropped
   entry set to ``-inf``: ``logp(where(kept, z, -inf), token, temperature)`` [B] FP32.
6. **Draw**: ``argmax_kept(s + G)`` with Gumbel noise ``G = -log(-log(u))`` (Gumbel 1954; the
   Gumbel-max trick, e.g. Maddison et al. 2014 "A* Sampling"), ``u`` in (0, 1) from a counter-based
   hash of (seed, sequence id, position, token id). ``argmax`` returns the lowest id among equal
   maxima.

Temperature 0 is greedy decoding: the token is ``argmax(z)`` (lowest id on ties), top-k / top-p do
not change it (rank 0 is always kept), and its logprob is the one under the *unscaled, unfiltered*
distribution, ``logp(z, token, 1.0)``. A temperature in ``(0, MIN_TEMPERATURE)`` is refused
(:data:`MIN_TEMPERATURE`), as is one above the largest FP32 number.

Non-finite rows (a NaN, a ``+inf``, or every entry ``-inf`` in ``s``; a ``-inf`` among finite
entries is an ordinary token of probability 0): the distribution is undefined in FP32 (its
normaliser is ``inf`` or ``0/0``), so for every setting (greedy, plain, top-k, top-p) the drawn token
is the row's **rank 0** — the lowest id holding a NaN, else the lowest id holding ``+inf``, else
(all ``-inf``) id 0 — and its logprob is **NaN**, which marks the token for the trainer instead of
a made-up number. The order of step 2 puts NaN above ``+inf`` (torch's sort and argmax do), so rank 0
is that token; the top-p filter keeps rank 0 explicitly (its cumulative weights are NaN in such a
row). More generally the logprob reported is NaN wherever the ``logp`` op's value is not finite,
which for a finite row would need ``|s_token - max s|`` beyond the FP32 range. Other rows of the
batch are unaffected: every step acts on one row.

Why every row's bits depend only on its own logits and its key (batch invariance): the hash is
integer arithmetic; the noise and the top-p weights use only IEEE-754 basic operations (``+ - * /``,
each one torch op, so nothing is contracted and every entry is rounded exactly once wherever it sits
in a tensor) — ``log`` and ``exp`` are written out here as polynomials instead of calling
``torch.log`` / ``torch.exp``, whose vectorised and scalar CPU paths may differ in the last bit
depending on where an entry falls in the flattened batch; the sort is a permutation; the cumulative
sum runs along one row; ``argmax`` of exact values has one answer; the logprob is the project's
batch-invariant ``logp`` kernel.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from numbers import Integral, Real

import torch

from rl_engine.errors import InputError
from rl_engine.rollout._f64 import (_EXP_TERMS, _EXP_UNDERFLOW, _INV_LN2, _LN2_HI, _LN2_LO, _LOG_TERMS, _MASK32,
                                    _SQRT_HALF)


# -- sampling settings ------------------------------------------------------------------------------
MIN_TEMPERATURE = 1e-5
"""The smallest temperature accepted above 0 (0 itself is greedy). Below it the FP32 division
``z / temperature`` overflows for logits of modest size (at 1e-38 every logit above 3.4 becomes
``+inf``, and the draw is no longer the tempered distribution), while it adds nothing a user can
see: at 1e-5 every pair of logits more than 0.0075 apart (745 x 1e-5, where the float64 weight
``exp(-gap / T)`` underflows to 0) is already decided as greedy decoding decides it. vLLM draws
greedily below the same value (its ``_SAMPLING_EPS``); here it is refused so the recorded settings
say what ran: pass 0 for greedy."""

FP32_MAX = float(torch.finfo(torch.float32).max)


@dataclass(frozen=True)
class SamplingParams:
    """Sampling settings of one ``generate`` call (recorded with every result, docs/pitfalls.md P11).

    ``temperature``: 0 (greedy) or in ``[MIN_TEMPERATURE, FP32 max]`` (the kernels receive it as
    FP32; :data:`MIN_TEMPERATURE`). ``top_k``: None (off) or an integer >= 1.
    ``top_p``: None (off) or a number in (0, 1] (1 = off). ``seed``: an integer in [0, 2^64).

    Raises
    ------
    InputError
        Any value outside those ranges or of the wrong type (a bool, a float seed, NaN, ...).
    """

    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        t = self.temperature
        if isinstance(t, bool) or not isinstance(t, Real) or not math.isfinite(float(t)) or float(t) < 0:
            raise InputError(f"temperature: expected a finite number >= 0 (0 = greedy), got {t!r}")
        if 0.0 < float(t) < MIN_TEMPERATURE:
            raise InputError(f"temperature {t!r}: below the smallest accepted temperature {MIN_TEMPERATURE!r} "
                             "(z / temperature overflows FP32 for ordinary logits); pass 0 for greedy decoding")
        if float(t) > FP32_MAX:
            raise InputError(f"temperature {t!r}: above the largest FP32 number {FP32_MAX!r} (the kernels divide "
                             "by it in FP32)")
        object.__setattr__(self, "temperature", float(t))
        k = self.top_k
        if k is not None and (isinstance(k, bool) or not isinstance(k, Integral) or int(k) < 1):
            raise InputError(f"top_k: expected None or an integer >= 1, got {k!r}")
        if k is not None:
            object.__setattr__(self, "top_k", int(k))
        p = self.top_p
        if p is not None:
            if isinstance(p, bool) or not isinstance(p, Real) or not (0.0 < float(p) <= 1.0):
                raise InputError(f"top_p: expected None or a number in (0, 1], got {p!r}")
            object.__setattr__(self, "top_p", float(p))
        s = self.seed
        if isinstance(s, bool) or not isinstance(s, Integral) or not 0 <= int(s) < 1 << 64:
            raise InputError(f"seed: expected an integer in [0, 2^64), got {s!r}")
        object.__setattr__(self, "seed", int(s))

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def filtered(self) -> bool:
        """True when top-k or top-p can drop tokens (sampling only; greedy ignores both)."""
        return not self.greedy and (self.top_k is not None or (self.top_p is not None and self.top_p < 1.0))

    def to_dict(self) -> dict[str, object]:
        return {"temperature": self.temperature, "top_k": self.top_k, "top_p": self.top_p, "seed": self.seed,
                "greedy": self.greedy}


# -- counter-based uniforms ---------------------------------------------------------------------------
def _mul32(x: torch.Tensor, c: int) -> torch.Tensor:
    """``(x * c) mod 2^32`` for x in [0, 2^32) held in int64, without signed overflow (16-bit halves)."""
    lo = x * (c & 0xFFFF)
    hi = torch.bitwise_and(x * (c >> 16), 0xFFFF) * 65536
    return torch.bitwise_and(lo + hi, _MASK32)


def _mix32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit avalanche mix (xor-shift-multiply, constants of C. Wellons' "lowbias32"); int64 in, int64 out."""
    x = torch.bitwise_xor(x, x >> 16)
    x = _mul32(x, 0x7FEB352D)
    x = torch.bitwise_xor(x, x >> 15)
    x = _mul32(x, 0x846CA68B)
    return torch.bitwise_xor(x, x >> 16)


def row_keys(seed: int, seq_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """[B] int64 32-bit keys of (seed, sequence id, position); seq_ids, positions [B] int64 >= 0."""
    k = _mix32(torch.full_like(seq_ids, (seed & _MASK32) ^ 0x9E3779B9))
    k = _mix32(torch.bitwise_xor(k, (seed >> 32) & _MASK32))
    k = _mix32(torch.bitwise_xor(k, torch.bitwise_and(seq_ids, _MASK32)))
    k = _mix32(torch.bitwise_xor(k, torch.bitwise_and(seq_ids >> 32, _MASK32)))
    return _mix32(torch.bitwise_xor(k, torch.bitwise_and(positions, _MASK32)))


def uniforms(keys: torch.Tensor, vocab: int) -> torch.Tensor:
    """[B, V] float64 uniforms in (0, 1), 52 random bits each, from row keys [B] and the token id.

    ``u = (n + 1/2) / 2^52`` for a 52-bit integer ``n``: exact in float64, never 0 or 1.
    """
    v = torch.arange(vocab, dtype=torch.int64, device=keys.device)
    a = _mix32(torch.bitwise_xor(_mix32(keys[:, None] ^ 0x85EBCA6B), v[None, :]))
    b = _mix32(torch.bitwise_xor(a, 0x27D4EB2F))
    bits = (a >> 12) * (1 << 32) + b  # 20 + 32 = 52 bits, exact in int64 and in float64
    return (bits.to(torch.float64) + 0.5) * (2.0 ** -52)


# -- log and exp from IEEE basic operations ------------------------------------------------------------
def log_f64(x: torch.Tensor) -> torch.Tensor:
    """Natural log of positive finite float64 entries, from ``frexp`` and ``+ - * /`` only.

    ``x = m 2^e`` with ``m`` in [sqrt(1/2), sqrt(2)); ``log m = 2 atanh(f)``, ``f = (m-1)/(m+1)``,
    as a Horner polynomial in ``f^2`` (fdlibm ``e_log.c`` uses the same reduction). A few ulps of
    float64 accurate; the bits of an entry do not depend on its neighbours or on the device.
    """
    m, e = torch.frexp(x)
    small = m < _SQRT_HALF
    m = torch.where(small, m * 2.0, m)
    e = (e - small.to(e.dtype)).to(torch.float64)
    f = (m - 1.0) / (m + 1.0)
    s = f * f
    poly = torch.full_like(s, 1.0 / (2 * _LOG_TERMS - 1))
    for k in range(_LOG_TERMS - 2, -1, -1):
        poly = poly * s + 1.0 / (2 * k + 1)
    return e * _LN2_HI + (e * _LN2_LO + (f * 2.0) * poly)


def exp_f64(x: torch.Tensor) -> torch.Tensor:
    """``exp`` of float64 entries <= 0 (0 below ``_EXP_UNDERFLOW``), from ``+ - * /`` and exact
    power-of-two scaling only: ``x = k ln2 + r``, ``exp(r)`` as a Horner Taylor polynomial."""
    under = x < _EXP_UNDERFLOW
    x = torch.where(under, torch.zeros_like(x), x)
    k = torch.round(x * _INV_LN2)
    r = (x - k * _LN2_HI) - k * _LN2_LO
    poly = torch.full_like(r, 1.0 / math.factorial(_EXP_TERMS - 1))
    for n in range(_EXP_TERMS - 2, -1, -1):
        poly = poly * r + 1.0 / math.factorial(n)
    scale = ((k.to(torch.int64) + 1023) << 52).view(torch.float64)  # 2^k, exact for k >= -1022
    return torch.where(under, torch.zeros_like(poly), poly * scale)


def gumbel_noise(u: torch.Tensor) -> torch.Tensor:
    """Standard Gumbel noise ``-log(-log(u))`` [B, V] float64 from uniforms in (0, 1)."""
    return -log_f64(-log_f64(u))


# -- the sampler ---------------------------------------------------------------------------------------
def scaled_logits(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """``s = logits / temperature`` [B, V] FP32 (the ``logp`` kernel's own division); logits for greedy.

    The temperature is rounded to FP32 (as the kernel receives it) and divides as a device tensor:
    CUDA turns a division by a Python scalar into a multiplication by its reciprocal, which rounds
    differently.
    """
    if params.greedy:
        return logits
    return logits / torch.full((), params.temperature, dtype=torch.float32, device=logits.device)


def kept_mask(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor | None:
    """[B, V] bool: the tokens top-k / top-p keep (module docstring, steps 2-4); None when nothing is dropped.

    ``logits`` [B, V] float32. Deterministic: a stable descending sort (ties by lower token id),
    float64 weights from :func:`exp_f64`, a cumulative sum along each row.
    """
    if not params.filtered:
        return None
    s = scaled_logits(logits, params)
    b, v = s.shape
    sorted_s, order = torch.sort(s, dim=1, descending=True, stable=True)
    rank = torch.arange(v, device=s.device)
    keep = torch.ones((b, v), dtype=torch.bool, device=s.device)
    if params.top_k is not None:
        keep = keep & (rank < params.top_k)[None, :]
    if params.top_p is not None and params.top_p < 1.0:
        w = exp_f64(sorted_s.to(torch.float64) - sorted_s[:, :1].to(torch.float64))
        w = torch.where(keep, w, torch.zeros_like(w))
        cum = torch.cumsum(w, dim=1)
        before = torch.cat([torch.zeros_like(cum[:, :1]), cum[:, :-1]], dim=1)
        # rank 0 is always kept: in a finite row its test (0 < total * top_p) holds anyway; in a
        # non-finite row (module docstring) the weights are NaN and the comparison is false
        keep = keep & ((before < cum[:, -1:] * params.top_p) | (rank == 0)[None, :])
    mask = torch.zeros((b, v), dtype=torch.bool, device=s.device)
    return mask.scatter(1, order, keep)


def sampling_logprobs(logp_fn, logits: torch.Tensor, tokens: torch.Tensor, params: SamplingParams,
                      mask: torch.Tensor | None = None) -> torch.Tensor:
    """FP32 [B] logprob of ``tokens`` [B] int64 under the sampling distribution of ``logits`` [B, V] FP32.

    ``logp_fn(logits=, targets=, temperature=)`` is the project's ``logp`` op of the model's backend.
    Greedy: ``logp(logits, tokens, 1.0)`` (unscaled, unfiltered). Otherwise
    ``logp(where(mask, logits, -inf), tokens, temperature)`` with ``mask`` from :func:`kept_mask`
    (computed here when not given). A value that is not finite is returned as NaN (the non-finite
    rows of the module docstring: the ``logp`` op declares only that their output is non-finite).
    """
    if params.greedy:
        lp = logp_fn(logits=logits, targets=tokens, temperature=1.0)
    else:
        if mask is None:
            mask = kept_mask(logits, params)
        if mask is not None:
            logits = torch.where(mask, logits, torch.full_like(logits, float("-inf")))
        lp = logp_fn(logits=logits, targets=tokens, temperature=params.temperature)
    return torch.where(torch.isfinite(lp), lp, torch.full_like(lp, float("nan")))


FUSED_DRAW_ON_CUDA = True
"""Whether the engine draws with the fused Gumbel-max kernels (:mod:`rl_engine.rollout.gumbel_triton`)
on a GPU. On: the chunked form (a row split over fixed vocabulary chunks, then one combining kernel)
passed its bit-for-bit test (``tests/rollout/test_rollout_sampling.py``) in the CPU interpreter and on
the H200 (``evidence/2026-12-01-h200-decode-5c38f19/round5-cd73cc6-flags-on/``). Its
one-program-per-row predecessor passed that test on the H200 and cut the Qwen3-8B step at B = 64
from 16.2 to 11.0 ms (``evidence/2026-12-01-h200-decode-5c38f19/round2-b5b86f9/``). A switch so a GPU
that fails that test can be given the reference path back."""


def _fused_draw_available(logits: torch.Tensor) -> bool:
    """Whether the one-kernel draw runs on these logits: float32 under the Triton interpreter on the
    CPU, or on a CUDA device once :data:`FUSED_DRAW_ON_CUDA` is on."""
    from rl_engine import env

    if logits.dtype != torch.float32:
        return False
    if logits.device.type == "cuda":
        return FUSED_DRAW_ON_CUDA
    return logits.device.type == "cpu" and env.triton_interpret()


class Sampler:
    """Draws one token per row and its sampling-distribution logprob (module docstring).

    The noise of row ``b`` is keyed by ``(params.seed, seq_ids[b], positions[b])`` where
    ``positions[b]`` is the position the drawn token takes in its sequence. Nothing else of the
    batch enters a row's result.
    """

    def key_ids(self, seq_ids: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
        """The sequence part of the noise key: the sequence ids [B] int64."""
        return seq_ids

    def sample(self, logp_fn, logits: torch.Tensor, seq_ids: torch.Tensor, slots: torch.Tensor,
               positions: torch.Tensor, params: SamplingParams) -> tuple[torch.Tensor, torch.Tensor]:
        """tokens [B] int64 and logprobs [B] FP32 from logits [B, V] FP32; seq_ids, slots (the
        engine's cache rows, unused by this sampler) and positions [B] int64."""
        if params.greedy:
            tokens = torch.argmax(logits, dim=1)
            return tokens, sampling_logprobs(logp_fn, logits, tokens, params)
        mask = kept_mask(logits, params)
        fused = _fused_draw_available(logits)
        if fused:  # one launch instead of ~100, the same bits (gumbel_triton)
            from rl_engine.rollout.gumbel_triton import row_keys_kernel

            keys = row_keys_kernel(params.seed, self.key_ids(seq_ids, slots).contiguous(), positions.contiguous())
        else:
            keys = row_keys(params.seed, self.key_ids(seq_ids, slots), positions)
        if mask is None and fused:  # one kernel, the same bits (gumbel_triton)
            from rl_engine.rollout.gumbel_triton import gumbel_argmax

            tokens = gumbel_argmax(logits.contiguous(), keys, params.temperature)
            return tokens, sampling_logprobs(logp_fn, logits, tokens, params, mask)
        score = scaled_logits(logits, params).to(torch.float64) + gumbel_noise(uniforms(keys, logits.shape[1]))
        if mask is not None:
            score = torch.where(mask, score, torch.full_like(score, float("-inf")))
        tokens = torch.argmax(score, dim=1)
        return tokens, sampling_logprobs(logp_fn, logits, tokens, params, mask)


class RowKeyedSampler(Sampler):
    """NEGATIVE CONTROL, never use: keys the noise by the batch row (the cache slot) instead of the
    sequence id, so a sequence's draws depend on where the scheduler placed it. The batch-invariance
    test of the engine must catch it."""

    def key_ids(self, seq_ids: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
        return slots.to(torch.int64)
