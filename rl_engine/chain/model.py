"""The Qwen3 dense forward, built only from the project's ops, serving two execution styles.

Shape glossary: B batch (sequences), S_max KV-cache slots, T packed tokens, N active tokens,
E hidden, F ffn, H query heads, Hkv KV heads, D head dim, V vocab.

One :meth:`Qwen3Model.forward` serves

* **packed varlen** calls (``cu_seqlens``): training-style teacher forcing over a batch of whole
  sequences, and the rollout-style prefill of the prompts (which also writes K/V into a static
  cache), and
* **decode** calls: one token for each of the B sequences against the static KV cache
  (``attention_decode``).

Every op is the project's op for the chosen backend (``get_spec(op).impls[backend]``, the
signatures of ``docs/ops-api.md``): ``embedding``, ``rms_norm`` (HF order from the contract),
``det_gemm`` for every projection as ``x @ W.T`` with ``b = W.t()`` (a transposed view, no
copy), ``qk_norm``, ``rope`` with FP32 cos/sin from ``rl_engine.ops.rope.cos_sin``, ``attention``
/ ``attention_decode``, ``swiglu``, and the logprob head ``linear_logp`` (or ``lm_head`` + ``logp``).
Residual adds are plain tensor adds in the execution dtype (BF16 for kernel backends, as Hugging
Face does). ``reference_fp32`` runs the whole model in FP32 on upcast weights (WS1 §3.1).

K and V enter the cache after RoPE, rounded to the execution dtype exactly once (by the rope /
projection op that produced them), and the prefill attention reads those same values (pitfall P8).

Math source: ``transformers/models/qwen3/modeling_qwen3.py`` (Qwen3DecoderLayer, Qwen3Attention,
Qwen3MLP, Qwen3RMSNorm, rotate-half RoPE).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from rl_engine.backends.registry import check_backend
from rl_engine.chain.config import Qwen3Config
from rl_engine.chain.weights import Qwen3Weights
from rl_engine.errors import BackendUnavailable, InputError, RLEngineError

CHAIN_OPS = ("embedding", "rms_norm", "qk_norm", "det_gemm", "rope", "attention", "swiglu",
             "linear_logp", "lm_head", "logp")
HEADS = ("linear_logp", "lm_head_logp")

LAYER_OP_ORDER = (
    "input_layernorm", "q_proj", "k_proj", "v_proj", "q_norm", "k_norm", "q_rope", "k_rope",
    "attention", "o_proj", "attn_residual", "post_attention_layernorm", "gate_proj", "up_proj",
    "swiglu", "down_proj", "mlp_residual",
)
"""Activations recorded per layer, in forward order (first-divergence localisation)."""

_DECODE_FUNCTIONS = {
    "reference_fp32": ("rl_engine.ops.attention.reference", ("attention_decode_reference", "attention_decode")),
    "torch_bf16": ("rl_engine.ops.attention.torch_bf16", ("attention_decode_torch_bf16", "attention_decode")),
    "triton_cuda_bf16": ("rl_engine.ops.attention.triton", ("attention_decode_triton", "attention_decode")),
}


class ChainOps:
    """The op implementations of one backend, resolved lazily through the op registry.

    ``ops.call("rms_norm", x=..., weight=..., eps=..., order=...)`` runs
    ``get_spec("rms_norm").impls[backend]``. ``attention_decode`` comes from the attention op's
    ``DECODE_IMPLS`` table (or its backend module). An external backend registered with
    ``rl_engine.register_backend`` supplies every op it provides (``attention_decode`` under that
    name). A missing op raises BackendUnavailable naming it.
    """

    def __init__(self, backend: str):
        from rl_engine.backends.registry import BACKENDS

        self.backend = backend
        self._impls: dict[str, Callable[..., Any]] = {}
        self._plugin = None
        if backend in BACKENDS:
            check_backend(backend)
        else:  # an external backend registered through rl_engine.backends.plugins
            from rl_engine.backends.plugins import get_plugin

            plugin = get_plugin(backend)
            if plugin is None:
                check_backend(backend)  # raises: unknown backend
            ok, why = plugin.availability()
            if not ok:
                raise BackendUnavailable(f"backend {backend} cannot run here: {why}")
            self._plugin = plugin

    def impl(self, op: str) -> Callable[..., Any]:
        if op in self._impls:
            return self._impls[op]
        if self._plugin is not None:
            fn = self._plugin.ops.get(op)
            if fn is None:
                raise BackendUnavailable(f"chain: backend {self.backend} does not provide {op}, which the chain needs")
            self._impls[op] = fn
            return fn
        if op == "attention_decode":
            fn = self._decode_impl()
        else:
            from rl_engine.ops.registry import get_spec

            try:
                spec = get_spec(op)
            except ModuleNotFoundError as exc:
                raise BackendUnavailable(f"chain: op {op} is not implemented yet "
                                         f"(rl_engine/ops/{op}/spec.py cannot be imported: {exc})") from exc
            if self.backend not in spec.impls:
                raise BackendUnavailable(f"chain: op {op} has no {self.backend} implementation")
            fn = spec.impls[self.backend]
        self._impls[op] = fn
        return fn

    def _decode_impl(self) -> Callable[..., Any]:
        try:  # the attention op's own table, when it has one
            from rl_engine.ops.attention.spec import DECODE_IMPLS

            if self.backend in DECODE_IMPLS:
                return DECODE_IMPLS[self.backend]
        except ImportError:
            pass
        if self.backend not in _DECODE_FUNCTIONS:
            raise BackendUnavailable(f"chain: no attention_decode for backend {self.backend}")
        module_name, names = _DECODE_FUNCTIONS[self.backend]
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            raise BackendUnavailable(f"chain: {module_name} cannot be imported ({exc}); "
                                     f"attention_decode for {self.backend} is missing") from exc
        for n in names:
            fn = getattr(module, n, None)
            if callable(fn):
                return fn
        raise BackendUnavailable(f"chain: {module_name} has none of {names} (attention_decode for {self.backend})")

    def call(self, op: str, **kwargs: Any) -> torch.Tensor:
        return self.impl(op)(**kwargs)

    def kernel_ids(self) -> dict[str, str]:
        """``op -> op/backend/function@source-hash`` for every op this model has run."""
        from rl_engine.gate.runner import kernel_id

        return {op: kernel_id(op, self.backend, fn) for op, fn in sorted(self._impls.items())}


@dataclass
class KVCache:
    """Static KV cache: per layer ``k[l], v[l]`` of shape [B, S_max, Hkv, D] in the execution dtype.

    Slots past a sequence's length are filled with NaN at allocation, so a kernel that reads an
    unwritten slot without masking it shows up as NaN instead of passing by luck.
    """

    k: list[torch.Tensor]
    v: list[torch.Tensor]

    @classmethod
    def allocate(cls, config: Qwen3Config, batch: int, s_max: int, dtype: torch.dtype,
                 device: torch.device, fill: float = float("nan")) -> KVCache:
        shape = (batch, s_max, config.num_key_value_heads, config.head_dim)
        mk = lambda: torch.full(shape, fill, dtype=dtype, device=device)  # noqa: E731
        return cls([mk() for _ in range(config.num_hidden_layers)], [mk() for _ in range(config.num_hidden_layers)])

    @property
    def batch(self) -> int:
        return self.k[0].shape[0]

    @property
    def s_max(self) -> int:
        return self.k[0].shape[1]


Recorder = Callable[[str, torch.Tensor], None]
"""``recorder(where, x)``: called with every op output [T, ...] of a forward call
(``where`` like ``layer3.q_proj``, ``embedding``, ``final_norm``)."""


class Qwen3Model:
    """Qwen3 dense model on one backend.

    ``weights`` are BF16 (:class:`Qwen3Weights`); for ``reference_fp32`` they are upcast to FP32
    once here (the same values). ``norm_order`` defaults to the contract's
    ``declared_exceptions.rms_norm_rounding_order`` (``hf``).

    Raises
    ------
    BackendUnavailable
        The backend cannot run here.
    InputError
        Weights in an unexpected dtype.
    """

    def __init__(self, weights: Qwen3Weights, backend: str, *, norm_order: str | None = None):
        self.ops = ChainOps(backend)
        self.backend = backend
        self.config = weights.config
        if norm_order is None:
            from rl_engine.contract import load_contract

            norm_order = load_contract().rms_norm_order
        self.norm_order = norm_order
        if backend == "reference_fp32":
            self.dtype = torch.float32
            self.weights = weights if weights.dtype == torch.float32 else weights.upcast(torch.float32)
        else:
            if weights.dtype != torch.bfloat16:
                raise InputError(f"backend {backend} runs on bfloat16 weights, got {weights.dtype}")
            self.dtype = torch.bfloat16
            self.weights = weights
        self.device = weights.device
        self._rope_table: tuple[torch.Tensor, torch.Tensor] | None = None

    # -- pieces ----------------------------------------------------------------------------------
    def rope_tables(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin [T, D/2] float32 for ``positions`` [T] int64.

        Rows of one table ``cos_sin(arange(max_position_embeddings))`` built once per model, so a
        position gets the same bits in every call (whatever the batch around it).
        """
        from rl_engine.ops.rope import cos_sin

        if self._rope_table is None:
            pos = torch.arange(self.config.max_position_embeddings, dtype=torch.int64, device=self.device)
            self._rope_table = cos_sin(pos, self.config.rope_theta, self.config.head_dim)
        if positions.numel():
            hi = int(positions.max())
            lo = int(positions.min())
            if lo < 0 or hi >= self.config.max_position_embeddings:
                raise InputError(f"positions: range [{lo}, {hi}] outside [0, max_position_embeddings="
                                 f"{self.config.max_position_embeddings})")
        cos, sin = self._rope_table
        return cos.index_select(0, positions).contiguous(), sin.index_select(0, positions).contiguous()

    def _linear(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        """``x [T, K] @ W[N, K].T`` through det_gemm with ``b = W.t()`` (a transposed view)."""
        return self.ops.call("det_gemm", a=x, b=w.t())

    def _norm(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return self.ops.call("rms_norm", x=x, weight=w, eps=self.config.rms_norm_eps, order=self.norm_order)

    # -- the forward -------------------------------------------------------------------------------
    def forward(self, ids: torch.Tensor, positions: torch.Tensor, *, cu_seqlens: torch.Tensor | None = None,
                cache: KVCache | None = None, decode: bool = False,
                recorder: Recorder | None = None) -> torch.Tensor:
        """Run the decoder stack and the final norm. Returns hidden [T, E] (execution dtype).

        Packed varlen (``decode=False``): ids, positions [T] int64 (positions restart at 0 in each
        sequence), ``cu_seqlens`` int32 [B+1]; causal attention within each sequence. With
        ``cache`` (B rows), token ``t`` of sequence ``b`` also writes its K/V (after RoPE) to
        ``cache.k[l][b, positions[t]]`` — the rollout prefill.

        Decode (``decode=True``): ids, positions [B] int64, one token per sequence, ``cache``
        required; K/V of the token are written to slot ``positions[b]``, then
        ``attention_decode(q [B, H, D], k_cache, v_cache, cache_seqlens=positions + 1, scale)``.

        Raises
        ------
        InputError
            Inconsistent shapes, positions outside the cache or the RoPE table.
        """
        cfg = self.config
        h, hkv, d = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        t = int(ids.shape[0])
        if ids.dim() != 1 or positions.shape != ids.shape:
            raise InputError(f"ids and positions must be [T] of one length, got {list(ids.shape)} and "
                             f"{list(positions.shape)}")
        rec = recorder or (lambda where, x: None)
        if decode:
            if cache is None:
                raise InputError("decode=True needs a KV cache")
            if t != cache.batch:
                raise InputError(f"decode: {t} tokens for a cache of batch {cache.batch}; one token per sequence")
            rows = torch.arange(t, device=ids.device)
            if t and int(positions.max()) >= cache.s_max:
                raise InputError(f"decode: position {int(positions.max())} beyond the cache's S_max={cache.s_max}")
            cache_seqlens = (positions + 1).to(torch.int32)
        else:
            if cu_seqlens is None:
                raise InputError("a packed varlen forward needs cu_seqlens")
            if cache is not None:
                lens = cu_seqlens[1:] - cu_seqlens[:-1]
                if lens.numel() != cache.batch:
                    raise InputError(f"prefill: {lens.numel()} sequences for a cache of batch {cache.batch}")
                rows = torch.repeat_interleave(torch.arange(lens.numel(), device=ids.device), lens.long())
                if t and int(positions.max()) >= cache.s_max:
                    raise InputError(f"prefill: position {int(positions.max())} beyond S_max={cache.s_max}")
        cos, sin = self.rope_tables(positions)
        x = self.ops.call("embedding", ids=ids, weight=self.weights.embed_tokens)
        rec("embedding", x)
        for li, lw in enumerate(self.weights.layers):
            p = f"layer{li}."
            residual = x
            xn = self._norm(x, lw.input_layernorm)
            rec(p + "input_layernorm", xn)
            q = self._linear(xn, lw.q_proj)
            rec(p + "q_proj", q)
            k = self._linear(xn, lw.k_proj)
            rec(p + "k_proj", k)
            v = self._linear(xn, lw.v_proj)
            rec(p + "v_proj", v)
            q = self.ops.call("qk_norm", x=q.reshape(t, h, d), weight=lw.q_norm, eps=cfg.rms_norm_eps,
                              order=self.norm_order)
            rec(p + "q_norm", q)
            k = self.ops.call("qk_norm", x=k.reshape(t, hkv, d), weight=lw.k_norm, eps=cfg.rms_norm_eps,
                              order=self.norm_order)
            rec(p + "k_norm", k)
            q = self.ops.call("rope", x=q, cos=cos, sin=sin)
            rec(p + "q_rope", q)
            k = self.ops.call("rope", x=k, cos=cos, sin=sin)
            rec(p + "k_rope", k)
            v = v.reshape(t, hkv, d)
            if cache is not None:
                # the one rounding of K/V happened in rope / v_proj; the cache stores those bits
                cache.k[li][rows, positions] = k
                cache.v[li][rows, positions] = v
            if decode:
                a = self.ops.call("attention_decode", q=q, k_cache=cache.k[li], v_cache=cache.v[li],
                                  cache_seqlens=cache_seqlens, scale=cfg.attention_scale)
            else:
                a = self.ops.call("attention", q=q, k=k, v=v, cu_seqlens_q=cu_seqlens, cu_seqlens_k=cu_seqlens,
                                  scale=cfg.attention_scale)
            rec(p + "attention", a)
            o = self._linear(a.reshape(t, h * d), lw.o_proj)
            rec(p + "o_proj", o)
            x = residual + o
            rec(p + "attn_residual", x)
            residual = x
            xn = self._norm(x, lw.post_attention_layernorm)
            rec(p + "post_attention_layernorm", xn)
            g = self._linear(xn, lw.gate_proj)
            rec(p + "gate_proj", g)
            u = self._linear(xn, lw.up_proj)
            rec(p + "up_proj", u)
            m = self.ops.call("swiglu", gate=g, up=u)
            rec(p + "swiglu", m)
            dn = self._linear(m, lw.down_proj)
            rec(p + "down_proj", dn)
            x = residual + dn
            rec(p + "mlp_residual", x)
        x = self._norm(x, self.weights.norm)
        rec("final_norm", x)
        return x

    def logprobs(self, hidden: torch.Tensor, targets: torch.Tensor, *, head: str = "linear_logp",
                 temperature: float = 1.0) -> torch.Tensor:
        """FP32 logprobs [N] of ``targets`` [N] int64 given final hidden rows [N, E].

        ``head="linear_logp"``: fused ``linear_logp(hidden, lm_head, targets, temperature)``;
        ``head="lm_head_logp"``: ``logp(lm_head(hidden, W) [N, V] fp32, targets, temperature)``.
        Logits are FP32 in both (DESIGN row 14).
        """
        if head == "linear_logp":
            out = self.ops.call("linear_logp", hidden=hidden, weight=self.weights.lm_head, targets=targets,
                                temperature=temperature)
        elif head == "lm_head_logp":
            logits = self.ops.call("lm_head", hidden=hidden, weight=self.weights.lm_head)
            out = self.ops.call("logp", logits=logits, targets=targets, temperature=temperature)
        else:
            raise InputError(f"head must be one of {HEADS}, got {head!r}")
        if out.dtype != torch.float32:
            raise RLEngineError(f"{head} on {self.backend} returned {out.dtype}; logprobs must be float32")
        return out

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """FP32 logits [N, V] of final hidden rows [N, E] (``lm_head`` op)."""
        return self.ops.call("lm_head", hidden=hidden, weight=self.weights.lm_head)


# -- batches of sequences ------------------------------------------------------------------------
@dataclass(frozen=True)
class SeqBatch:
    """Sequences to score: token ids [L_b] int64 per sequence, and the prompt length P_b of each.

    The active tokens of sequence b are its completion tokens ``tokens[b][P_b:]`` (C_b = L_b - P_b
    of them, C_b >= 1, P_b >= 1); token ``t`` is scored given tokens ``< t``.
    """

    tokens: tuple[torch.Tensor, ...]
    prompt_lens: tuple[int, ...]

    def __post_init__(self) -> None:
        if len(self.tokens) != len(self.prompt_lens):
            raise InputError(f"{len(self.tokens)} sequences but {len(self.prompt_lens)} prompt lengths")
        for b, (tok, p) in enumerate(zip(self.tokens, self.prompt_lens)):
            if tok.dim() != 1 or tok.dtype != torch.int64:
                raise InputError(f"sequence {b}: expected [L] int64 token ids, got {list(tok.shape)} {tok.dtype}")
            if not 1 <= p < tok.numel():
                raise InputError(f"sequence {b}: prompt length {p} must be in [1, L-1] with L={tok.numel()}")

    @property
    def batch(self) -> int:
        return len(self.tokens)

    def completion_lens(self) -> list[int]:
        return [int(t.numel()) - p for t, p in zip(self.tokens, self.prompt_lens)]

    @property
    def active_tokens(self) -> int:
        return sum(self.completion_lens())

    def subset(self, idx: Sequence[int]) -> SeqBatch:
        return SeqBatch(tuple(self.tokens[i] for i in idx), tuple(self.prompt_lens[i] for i in idx))

    def active_index(self) -> list[tuple[int, int]]:
        """(sequence, position of the scored token) of every active token, in output order."""
        return [(b, p) for b, (tok, pl) in enumerate(zip(self.tokens, self.prompt_lens))
                for p in range(pl, int(tok.numel()))]


def _cu(lengths: Sequence[int], device: torch.device) -> torch.Tensor:
    cu = [0]
    for n in lengths:
        cu.append(cu[-1] + int(n))
    return torch.tensor(cu, dtype=torch.int32, device=device)


class TokenKeys:
    """Global token keys for recording: key = offset[b] + position, one per (sequence, position)."""

    def __init__(self, batch: SeqBatch):
        self.offsets = [0]
        for tok in batch.tokens:
            self.offsets.append(self.offsets[-1] + int(tok.numel()))
        self.total = self.offsets[-1]

    def key(self, b: int, pos: int) -> int:
        return self.offsets[b] + pos

    def locate(self, key: int) -> tuple[int, int]:
        for b in range(len(self.offsets) - 1):
            if key < self.offsets[b + 1]:
                return b, key - self.offsets[b]
        raise IndexError(key)


def score_teacher_forcing(model: Qwen3Model, batch: SeqBatch, *, head: str = "linear_logp",
                          temperature: float = 1.0, micro_batch: int | None = None,
                          recorder: Any = None) -> torch.Tensor:
    """Training style: packed varlen forward over whole sequences, logprob of token t+1 given <= t.

    Returns FP32 [N] for the active (completion) tokens in :meth:`SeqBatch.active_index` order.
    ``micro_batch`` splits the sequences into consecutive groups of that many, scored by separate
    forwards (the result must not depend on it: pitfall P1). ``recorder`` (an
    :class:`rl_engine.chain.parity.ActivationRecorder`) sees every op output.
    """
    dev = model.device
    groups = [list(range(batch.batch))]
    if micro_batch is not None:
        if micro_batch < 1:
            raise InputError(f"micro_batch must be >= 1, got {micro_batch}")
        groups = [list(range(i, min(i + micro_batch, batch.batch))) for i in range(0, batch.batch, micro_batch)]
    keys = TokenKeys(batch) if recorder is not None else None
    out = []
    with torch.no_grad():
        for grp in groups:
            sub = batch.subset(grp)
            lens = [int(t.numel()) for t in sub.tokens]
            ids = torch.cat(list(sub.tokens)).to(dev)
            positions = torch.cat([torch.arange(n, dtype=torch.int64) for n in lens]).to(dev)
            cu = _cu(lens, dev)
            if recorder is not None:
                recorder.set_rows([keys.key(b, p) for b in grp for p in range(int(batch.tokens[b].numel()))])
            hidden = model.forward(ids, positions, cu_seqlens=cu, recorder=recorder)
            rows, targets = [], []
            start = 0
            for tok, pl, n in zip(sub.tokens, sub.prompt_lens, lens):
                rows.extend(range(start + pl - 1, start + n - 1))
                targets.append(tok[pl:])
                start += n
            rows_t = torch.tensor(rows, dtype=torch.int64, device=dev)
            h_act = hidden.index_select(0, rows_t)
            lp = model.logprobs(h_act, torch.cat(targets).to(dev), head=head, temperature=temperature)
            if recorder is not None:
                recorder.set_rows([keys.key(b, p - 1) for b in grp
                                   for p in range(batch.prompt_lens[b], int(batch.tokens[b].numel()))])
                recorder("logp", lp)
            out.append(lp)
    return torch.cat(out) if out else torch.zeros(0, dtype=torch.float32, device=dev)


def score_rollout(model: Qwen3Model, batch: SeqBatch, *, head: str = "linear_logp", temperature: float = 1.0,
                  recorder: Any = None, cache_fill: float = float("nan")) -> torch.Tensor:
    """Rollout style: prefill every prompt (packed varlen, K/V into a static cache), then decode
    token by token for all B sequences at once, fed the batch's own completion tokens.

    Decode step ``s`` feeds token ``P_b + s`` of every sequence b (one step = B tokens) and scores
    token ``P_b + s + 1``; the prefill's last row scores token ``P_b``. A sequence whose
    completion is shorter than the longest keeps being fed a dummy token (id 0 at position
    ``L_b - 1``, a slot no later step of that sequence reads) whose results are discarded, so
    every step has B rows. The cache has ``S_max = max_b L_b`` slots. Sampling settings: temperature as given, no
    top-k, no top-p (the tokens are the fixture's, not sampled).

    Returns FP32 [N] in :meth:`SeqBatch.active_index` order.
    """
    dev = model.device
    cfg = model.config
    bsz = batch.batch
    comp = batch.completion_lens()
    steps = max(comp) - 1
    s_max = max(int(t.numel()) for t in batch.tokens)
    keys = TokenKeys(batch) if recorder is not None else None
    per_seq: list[list[torch.Tensor]] = [[] for _ in range(bsz)]
    with torch.no_grad():
        cache = KVCache.allocate(cfg, bsz, s_max, model.dtype, dev, fill=cache_fill)
        # prefill
        plens = list(batch.prompt_lens)
        ids = torch.cat([t[:p] for t, p in zip(batch.tokens, plens)]).to(dev)
        positions = torch.cat([torch.arange(p, dtype=torch.int64) for p in plens]).to(dev)
        cu = _cu(plens, dev)
        if recorder is not None:
            recorder.set_rows([keys.key(b, p) for b in range(bsz) for p in range(plens[b])])
        hidden = model.forward(ids, positions, cu_seqlens=cu, cache=cache, recorder=recorder)
        last = torch.tensor([int(c) - 1 for c in cu[1:].tolist()], dtype=torch.int64, device=dev)
        targets = torch.stack([t[p] for t, p in zip(batch.tokens, plens)]).to(dev)
        lp = model.logprobs(hidden.index_select(0, last), targets, head=head, temperature=temperature)
        if recorder is not None:
            recorder.set_rows([keys.key(b, plens[b] - 1) for b in range(bsz)])
            recorder("logp", lp)
        for b in range(bsz):
            per_seq[b].append(lp[b : b + 1])
        # decode
        for s in range(steps):
            live = [s < comp[b] - 1 for b in range(bsz)]
            step_ids = torch.tensor([int(batch.tokens[b][plens[b] + s]) if live[b] else 0 for b in range(bsz)],
                                    dtype=torch.int64, device=dev)
            step_pos = torch.tensor([plens[b] + s if live[b] else plens[b] + comp[b] - 1 for b in range(bsz)],
                                    dtype=torch.int64, device=dev)
            step_tgt = torch.tensor([int(batch.tokens[b][plens[b] + s + 1]) if live[b] else 0 for b in range(bsz)],
                                    dtype=torch.int64, device=dev)
            if recorder is not None:
                recorder.set_rows([keys.key(b, plens[b] + s) if live[b] else -1 for b in range(bsz)])
            hidden = model.forward(step_ids, step_pos, cache=cache, decode=True, recorder=recorder)
            lp = model.logprobs(hidden, step_tgt, head=head, temperature=temperature)
            if recorder is not None:
                recorder("logp", lp)
            for b in range(bsz):
                if live[b]:
                    per_seq[b].append(lp[b : b + 1])
    parts = [torch.cat(p) for p in per_seq]
    return torch.cat(parts) if parts else torch.zeros(0, dtype=torch.float32, device=dev)


SAMPLING = {"temperature": 1.0, "top_k": None, "top_p": None,
            "tokens": "fed from the fixture (teacher-forced decode), not sampled"}
"""Sampling settings of both styles, recorded with every result (pitfall P11)."""
