"""Run a Hugging Face ``transformers`` Qwen3 model on the project's kernels (issue #35).

Shape glossary: B batch rows, S tokens per row, T = B * S tokens of one forward, N scored tokens,
E hidden, F ffn, H query heads, Hkv KV heads, D head dim, V vocab.

:func:`apply` routes a ``transformers`` ``Qwen3ForCausalLM`` (or a bare ``Qwen3Model``) through
the ops of one kernel backend (``triton_cuda_bf16`` or ``cuda_bf16``), in place and reversibly:

==============================================  ==========================================
Hugging Face module                             the project's op (``docs/ops-api.md``)
==============================================  ==========================================
``embed_tokens`` (``nn.Embedding``)             ``embedding``
``q/k/v/o_proj``, ``gate/up/down_proj``         ``det_gemm`` as ``x @ W.T`` (``b = W.t()``)
``input_layernorm``, ``post_attention_...``,    ``rms_norm`` (the contract's rounding order)
``norm`` (``Qwen3RMSNorm``)
``q_norm``, ``k_norm`` (``Qwen3RMSNorm``)       ``qk_norm``
``rotary_emb`` + ``apply_rotary_pos_emb``       ``rope`` with FP32 cos/sin from ``cos_sin``
``Qwen3MLP`` (``act_fn(gate) * up``)            ``swiglu``
attention function (``AttentionInterface``)     ``attention`` (packed varlen, ``cu_seqlens``)
``lm_head`` (``nn.Linear``)                     ``lm_head`` (FP32 logits [B, S, V])
:func:`logprobs`                                ``lm_head`` + ``logp``, or ``linear_logp``
==============================================  ==========================================

Each module keeps its parameters (no copy); only its ``forward`` is replaced by an instance
attribute, and ``Qwen3Attention.forward`` calls the attention function that
``transformers.AttentionInterface`` holds under :data:`ATTN_IMPLEMENTATION` (``"rl_engine"``), set
as the model's ``config._attn_implementation``. Residual adds stay Hugging Face's own BF16 tensor
adds, as in the chain. The op sequence, the rounding points (BF16 between ops; FP32 only inside
the kernels, in the RoPE tables, the logits and the logprobs) and the sites are those of
:meth:`rl_engine.chain.model.Qwen3Model.forward` in its unpacked form, so the logprobs are the
chain's bits (``docs/integrations.md`` says which tests back which claim).

Inputs the integration can honour: ``input_ids`` [B, S] int64 (or ``inputs_embeds`` [B, S, E]
bf16); ``attention_mask`` None or a 2-D 0/1 mask of right padding (all ones is the plain case);
``position_ids`` None or [1 | B, S] int64 whose valid part per row is one or more runs ``0, 1, 2,
...`` (a reset to 0 starts the next packed sequence, as Hugging Face's flash-attention path reads
them); a ``DynamicCache`` for generation on unpadded, unpacked rows. Everything else is refused
with :class:`~rl_engine.errors.InputError` before any op runs.

Math source: ``transformers/models/qwen3/modeling_qwen3.py`` (5.x) and the chain
(:mod:`rl_engine.chain.model`), whose ops this module calls through the same
:class:`~rl_engine.chain.model.OpTable`.
"""

from __future__ import annotations

import inspect

import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch

from rl_engine.chain.config import ConfigError, Qwen3Config
from rl_engine.chain.model import HEADS, MODEL_OPS, OpTable
from rl_engine.chain.weights import LayerWeights, Qwen3Weights
from rl_engine.errors import InputError, RLEngineError

ATTN_IMPLEMENTATION = "rl_engine"
"""The name of the attention function in ``transformers.AttentionInterface`` (registered by :func:`apply`)."""

FLASH_KWARGS = ("cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k")
"""Hugging Face's packed-sequence keyword arguments (``DataCollatorWithFlattening``): checked
against the plan built from ``position_ids`` and then dropped (the plan carries them)."""

_PATCHED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
"""Every patched module tree (the model and its inner ``Qwen3Model``) -> a weak reference to its
:class:`KernelPatch` (the patched forwards hold the patch alive; nothing here holds the model)."""


# -- transformers, loaded when asked for ---------------------------------------------------------
def _hf() -> Any:
    """The ``transformers`` Qwen3 modeling module (imported on first use, never at import)."""
    try:
        import transformers
        from transformers.models.qwen3 import modeling_qwen3
    except Exception as exc:  # ImportError, or a transformers without Qwen3
        raise RLEngineError(f"rl_engine.integrations.transformers needs the 'transformers' package with Qwen3 "
                            f"support: {type(exc).__name__}: {exc}") from exc
    major = int(transformers.__version__.split(".")[0])
    if major < 5:
        raise RLEngineError(f"rl_engine.integrations.transformers needs transformers >= 5 (its Qwen3 modules and "
                            f"cache API; tested with 5.24), found {transformers.__version__}")
    return modeling_qwen3


def _split(model: Any) -> tuple[Any, Any | None]:
    """``(base Qwen3Model, Qwen3ForCausalLM or None)``; InputError for any other object."""
    m = _hf()
    if isinstance(model, m.Qwen3ForCausalLM):
        return model.model, model
    if isinstance(model, m.Qwen3Model):
        return model, None
    raise InputError(f"expected a transformers Qwen3ForCausalLM or Qwen3Model, got {type(model).__module__}."
                     f"{type(model).__qualname__}")


# -- config and weights --------------------------------------------------------------------------
def qwen3_config(hf_config: Any) -> Qwen3Config:
    """The chain's :class:`~rl_engine.chain.config.Qwen3Config` of a ``transformers`` Qwen3 config.

    Read through :meth:`Qwen3Config.from_dict` on ``hf_config.to_dict()``, so every feature the
    chain cannot represent is refused there (rope scaling / a ``rope_type`` other than default,
    sliding-window layers, attention biases, an activation other than SiLU). Also refused here:
    ``attention_dropout`` other than 0 (the attention op has no dropout) and ``is_causal=False``.

    Raises
    ------
    ConfigError
        Naming the field the chain cannot represent.
    """
    d = hf_config.to_dict()
    cfg = Qwen3Config.from_dict(d, source="transformers config")
    if float(d.get("attention_dropout") or 0.0) != 0.0:
        raise ConfigError(f"transformers config: attention_dropout={d['attention_dropout']} is not supported "
                          f"(the attention op has no dropout)")
    if d.get("is_causal", True) is False:
        raise ConfigError("transformers config: is_causal=false is not supported (causal attention only)")
    return cfg


def qwen3_weights(model: Any, *, detach: bool = True) -> Qwen3Weights:
    """The chain's :class:`~rl_engine.chain.weights.Qwen3Weights` over a ``transformers`` model's
    parameters, sharing their storage (nothing is copied or cast).

    ``model``: ``Qwen3ForCausalLM`` (or a bare ``Qwen3Model`` with tied embeddings, whose head is
    the embedding). ``detach=True`` gives views without autograd history (``requires_grad``
    False); ``detach=False`` puts the ``nn.Parameter`` objects themselves in the container, so a
    chain forward under autograd accumulates into the model's ``.grad``. With
    ``tie_word_embeddings`` the head is the very embedding tensor (``Qwen3Weights.validate``).
    Shapes as the Hugging Face state dict (``[out, in]`` projections, see
    :mod:`rl_engine.chain.weights`), BF16.

    Raises
    ------
    InputError
        Not a Qwen3 model; a bare untied ``Qwen3Model`` (it has no head); a tied config whose
        ``lm_head.weight`` is not the embedding parameter.
    ConfigError
        See :func:`qwen3_config`.
    WeightError
        A tensor of the wrong shape or a dtype other than bfloat16 (naming it).
    """
    base, causal = _split(model)
    cfg = qwen3_config(model.config)
    grab: Callable[[torch.Tensor], torch.Tensor] = (lambda p: p.detach()) if detach else (lambda p: p)
    embed = grab(base.embed_tokens.weight)
    if causal is None:
        if not cfg.tie_word_embeddings:
            raise InputError("a bare Qwen3Model has no lm_head: pass the Qwen3ForCausalLM (or tie the embeddings)")
        head = embed
    elif cfg.tie_word_embeddings:
        if causal.lm_head.weight is not base.embed_tokens.weight:
            raise InputError("tie_word_embeddings is true but lm_head.weight is not model.embed_tokens.weight "
                             "(call model.tie_weights() first)")
        head = embed
    else:
        head = grab(causal.lm_head.weight)
    layers = []
    for layer in base.layers:
        a, mlp = layer.self_attn, layer.mlp
        layers.append(LayerWeights(
            q_proj=grab(a.q_proj.weight), k_proj=grab(a.k_proj.weight), v_proj=grab(a.v_proj.weight),
            o_proj=grab(a.o_proj.weight), q_norm=grab(a.q_norm.weight), k_norm=grab(a.k_norm.weight),
            input_layernorm=grab(layer.input_layernorm.weight),
            post_attention_layernorm=grab(layer.post_attention_layernorm.weight),
            gate_proj=grab(mlp.gate_proj.weight), up_proj=grab(mlp.up_proj.weight),
            down_proj=grab(mlp.down_proj.weight)))
    w = Qwen3Weights(cfg, embed, layers, grab(base.norm.weight), head,
                     {"kind": "transformers", "class": type(model).__qualname__, "shared_storage": True})
    w.validate(torch.bfloat16)
    return w


# -- one forward's layout ------------------------------------------------------------------------
@dataclass(frozen=True)
class _Plan:
    """What the patched modules of one forward need besides their inputs (built and validated by
    :meth:`KernelPatch.plan`, handed down as the ``rl_engine_plan`` keyword argument, which
    Hugging Face passes from ``Qwen3Model.forward`` to every attention function)."""

    ops: Any  # the op table of this forward
    cu_q: torch.Tensor  # int32 [N+1] over the T = B * S query tokens (padding blocks are sequences of their own)
    cu_k: torch.Tensor  # int32 [N+1] over the keys (== cu_q without a cache)
    past: int  # tokens already in the cache (0 without one)
    lengths: tuple[int, ...]  # valid (non-padding) tokens of each row
    positions: torch.Tensor  # int64 [B, S] on the model's device
    starts: torch.Tensor  # bool [B, S] (CPU): the token starts a sequence (position 0 within the valid part)
    packed_or_padded: bool
    varlen: Any = None  # the attention's VarlenPlan of cu_q / cu_k (checked once per forward), when its op takes one


def _check_tensor(name: str, x: Any, *, dtype: torch.dtype | None = None, ndim: int | None = None) -> None:
    if not isinstance(x, torch.Tensor):
        raise InputError(f"{name}: expected a torch.Tensor, got {type(x).__name__}")
    if dtype is not None and x.dtype != dtype:
        raise InputError(f"{name}: expected dtype {str(dtype).replace('torch.', '')}, got "
                         f"{str(x.dtype).replace('torch.', '')} (nothing is cast)")
    if ndim is not None and x.dim() != ndim:
        raise InputError(f"{name}: expected {ndim} dimensions, got shape {list(x.shape)}")


# -- the handle ----------------------------------------------------------------------------------
class KernelPatch:
    """The handle :func:`apply` returns: what was patched, and how to put it back.

    ``backend`` the kernel backend; ``ops`` the :class:`~rl_engine.chain.model.OpTable` every
    patched module calls (swap it for a recording table to see every op output under the chain's
    site names, e.g. ``layer0.q_proj``); ``config`` the chain's :class:`Qwen3Config`;
    ``norm_order`` the contract's RMSNorm rounding order. :meth:`undo` (or leaving a ``with``
    block) restores every replaced ``forward`` and the attention implementation; after it the
    model computes exactly what it computed before :func:`apply` (bitwise; tested).
    """

    def __init__(self, model: Any, base: Any, causal: Any | None, backend: str, ops: OpTable,
                 config: Qwen3Config, norm_order: str):
        self.model, self.base, self.causal = model, base, causal
        self.backend, self.ops, self.config, self.norm_order = backend, ops, config, norm_order
        self.device = base.embed_tokens.weight.device
        self.active = False
        self._saved: list[tuple[torch.nn.Module, bool, Any]] = []
        self._attn_saved: list[tuple[Any, Any]] = []
        self._rope: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}

    # -- patching ----------------------------------------------------------------------------
    def _set_forward(self, module: torch.nn.Module, fn: Callable[..., Any]) -> None:
        had = "forward" in module.__dict__
        self._saved.append((module, had, module.__dict__.get("forward")))
        module.forward = fn

    def undo(self) -> None:
        """Restore every replaced ``forward`` and the attention implementation of every config
        :func:`apply` changed. Idempotent (a second call does nothing). The attention function
        stays registered in ``transformers.AttentionInterface`` (other patched models may use it;
        an unpatched model never selects it)."""
        if not self.active:
            return
        for module, had, old in reversed(self._saved):
            if had:
                module.forward = old
            else:
                module.__dict__.pop("forward", None)
        for cfg, impl in self._attn_saved:
            cfg._attn_implementation_internal = impl
        self._saved.clear()
        self._attn_saved.clear()
        for m in (self.model, self.base):
            if patch_of(m) is self:
                del _PATCHED[m]
        self.active = False

    def __enter__(self) -> KernelPatch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.undo()

    # -- RoPE tables -------------------------------------------------------------------------
    def rope_table(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin [max_position_embeddings, D/2] float32 on ``device``: the table
        :meth:`rl_engine.chain.model.Qwen3Model.rope_tables` builds (``cos_sin`` of every position
        at once), so a position gets the chain's bits."""
        if device not in self._rope:
            from rl_engine.ops.rope import cos_sin

            pos = torch.arange(self.config.max_position_embeddings, dtype=torch.int64, device=device)
            self._rope[device] = cos_sin(pos, self.config.rope_theta, self.config.head_dim)
        return self._rope[device]

    # -- validation of one forward's inputs ----------------------------------------------------
    def check_state(self) -> None:
        """Before a forward: the patch is active, the attention implementation is still ours, and
        every parameter is still bfloat16 on one device (InputError otherwise)."""
        if not self.active:
            raise InputError("this KernelPatch was undone; call apply() again")
        impl = self.base.config._attn_implementation
        if impl != ATTN_IMPLEMENTATION:
            raise InputError(f"config._attn_implementation was changed to {impl!r} after apply(); undo() and apply() "
                             f"again to run on the project's kernels")
        for name, p in self.model.named_parameters():
            if p.dtype != torch.bfloat16 or p.device != self.device:
                raise InputError(f"{name}: {str(p.dtype).replace('torch.', '')} on {p.device} after apply(); the "
                                 f"patched model runs on bfloat16 parameters on {self.device}")

    def plan(self, input_ids: torch.Tensor | None, inputs_embeds: torch.Tensor | None,
             attention_mask: torch.Tensor | None, position_ids: torch.Tensor | None, cache: Any,
             use_cache: bool | None, kwargs: dict[str, Any]) -> _Plan:
        """Validate one forward's inputs (before any op runs) and build its :class:`_Plan`.

        Reads ``attention_mask`` and ``position_ids`` on the host once (not capture-safe).
        Pops Hugging Face's flash-attention keyword arguments (:data:`FLASH_KWARGS`) from
        ``kwargs`` after checking them against ``position_ids``.

        Raises
        ------
        InputError
            Naming the argument: both or neither of input_ids / inputs_embeds; a wrong dtype,
            shape or device; token ids outside ``[0, V)`` (padding included); an empty batch;
            ``output_attentions``; a 4-D or non-0/1 mask, left padding or holes; positions that
            are not runs ``0, 1, 2, ...`` (or, with a cache of ``past`` tokens, not
            ``past .. past + S - 1``), or outside ``max_position_embeddings``; a cache other than
            ``DynamicCache``; padding with a non-empty cache; a packed or padded batch asked to
            fill a cache; flash-attention arguments that disagree with the plan; the patch undone,
            the attention implementation switched, or a parameter cast or moved after apply.
        """
        self.check_state()
        cfg = self.config
        if (input_ids is None) == (inputs_embeds is None):
            raise InputError("pass exactly one of input_ids or inputs_embeds")
        if input_ids is not None:
            _check_tensor("input_ids", input_ids, dtype=torch.int64, ndim=2)
            if input_ids.numel():
                lo, hi = int(input_ids.min()), int(input_ids.max())
                if lo < 0 or hi >= cfg.vocab_size:
                    raise InputError(f"input_ids: range [{lo}, {hi}] outside [0, vocab_size={cfg.vocab_size}) (padding "
                                     f"tokens too: they still pass through the embedding)")
            x = input_ids
        else:
            _check_tensor("inputs_embeds", inputs_embeds, dtype=torch.bfloat16, ndim=3)
            if inputs_embeds.shape[-1] != cfg.hidden_size:
                raise InputError(f"inputs_embeds: expected [B, S, {cfg.hidden_size}], got {list(inputs_embeds.shape)}")
            x = inputs_embeds
        if x.device != self.device:
            raise InputError(f"{'input_ids' if input_ids is not None else 'inputs_embeds'}: on {x.device}, the model "
                             f"is on {self.device}")
        b, s = int(x.shape[0]), int(x.shape[1])
        if b == 0 or s == 0:
            raise InputError(f"expected at least one row and one token, got [B, S] = [{b}, {s}]")
        if kwargs.get("output_attentions") or getattr(self.base.config, "output_attentions", False):
            raise InputError("output_attentions: the attention op returns no attention weights")
        past = 0
        if cache is not None:
            from transformers import DynamicCache

            if type(cache) is not DynamicCache:
                raise InputError(f"cache: only a transformers DynamicCache is supported, got {type(cache).__name__}")
            past = int(cache.get_seq_length())
        lengths = [s] * b
        if attention_mask is not None:
            _check_tensor("attention_mask", attention_mask)
            if attention_mask.dim() != 2:
                raise InputError(f"attention_mask: expected a 2-D [B, S] padding mask of 0 / 1, got shape "
                                 f"{list(attention_mask.shape)} (prepared 4-D masks cannot be represented: the "
                                 f"attention op is causal within packed sequences)")
            if tuple(attention_mask.shape) != (b, past + s):
                raise InputError(f"attention_mask: expected shape [{b}, {past + s}] (B, past + S), got "
                                 f"{list(attention_mask.shape)}")
            m = attention_mask.detach().cpu()
            if m.dtype != torch.bool:
                if m.is_complex() or not bool(((m == 0) | (m == 1)).all()):
                    raise InputError("attention_mask: values must be 0 or 1")
                m = m != 0
            n = m.sum(1)
            right = torch.arange(past + s)[None, :] < n[:, None]
            if not torch.equal(m, right):
                row = int((m != right).any(1).nonzero()[0, 0])
                raise InputError(f"attention_mask: row {row} has a 0 before a 1 (left padding or a hole); only "
                                 f"right padding (ones, then zeros) can be represented")
            if past and not bool(m.all()):
                raise InputError("attention_mask: padding together with a cache of past tokens is not supported "
                                 "(generate on unpadded rows)")
            lengths = [int(v) - past for v in n.tolist()]
        if position_ids is None:
            pos_dev = torch.arange(past, past + s, dtype=torch.int64, device=self.device)[None, :].expand(b, s)
        else:
            _check_tensor("position_ids", position_ids, dtype=torch.int64, ndim=2)
            if position_ids.shape[1] != s or position_ids.shape[0] not in (1, b):
                raise InputError(f"position_ids: expected shape [1, {s}] or [{b}, {s}], got {list(position_ids.shape)}")
            if position_ids.device != self.device:
                raise InputError(f"position_ids: on {position_ids.device}, the model is on {self.device}")
            pos_dev = position_ids.expand(b, s)
        pos = pos_dev.detach().cpu()
        lo, hi = int(pos.min()), int(pos.max())
        if lo < 0 or hi >= cfg.max_position_embeddings:
            raise InputError(f"position_ids: range [{lo}, {hi}] outside [0, max_position_embeddings="
                             f"{cfg.max_position_embeddings})")
        starts = torch.zeros(b, s, dtype=torch.bool)
        cu = [0]
        packed = False
        for r in range(b):
            row = pos[r]
            if past:
                if not torch.equal(row, torch.arange(past, past + s)):
                    raise InputError(f"position_ids: with {past} cached tokens, row {r} must be "
                                     f"{past} .. {past + s - 1}")
                cu.append(cu[-1] + s)
                continue
            n = lengths[r]
            valid = row[:n]
            if n:
                if int(valid[0]) != 0:
                    raise InputError(f"position_ids: row {r} starts at {int(valid[0])}; a sequence starts at 0 "
                                     f"(pass a cache for a continuation)")
                ok = (valid[1:] - valid[:-1] == 1) | (valid[1:] == 0)
                if not bool(ok.all()):
                    t = int((~ok).nonzero()[0, 0]) + 1
                    raise InputError(f"position_ids: row {r}, token {t}: {int(valid[t - 1])} then "
                                     f"{int(valid[t])}; each sequence's positions must be 0, 1, 2, ... (a reset "
                                     f"to 0 starts the next packed sequence)")
                starts[r, :n] = valid == 0
                first = (valid == 0).nonzero()[:, 0].tolist()
                packed = packed or len(first) > 1
                for end in first[1:] + [n]:
                    cu.append(r * s + end)
            if n < s:  # the padding block: a sequence of its own, which no valid token sees
                cu.append(r * s + s)
        padded = any(n < s for n in lengths)
        given = {k: kwargs.pop(k) for k in FLASH_KWARGS if k in kwargs}
        for k in ("cu_seq_lens_q", "cu_seq_lens_k"):
            if given.get(k) is not None:
                got = given[k].tolist() if isinstance(given[k], torch.Tensor) else list(given[k])
                if past or padded or got != cu:
                    raise InputError(f"{k}: {got} disagrees with the sequences position_ids describe ({cu}); pass "
                                     f"position_ids that restart at 0 for each packed sequence")
        if (packed or padded) and (use_cache or cache is not None):
            raise InputError("a packed or padded batch cannot fill a KV cache (its rows are not single sequences); "
                             "pass use_cache=False, or generate on unpadded rows")
        cu_q = torch.tensor(cu, dtype=torch.int32, device=self.device)
        cu_k_host = cu if not past else [r * (past + s) for r in range(b + 1)]
        cu_k = cu_q if not past else torch.tensor(cu_k_host, dtype=torch.int32, device=self.device)
        varlen = None
        accepts = getattr(self.ops, "accepts", None)  # a duck-typed table without it: each layer checks
        if accepts is not None and accepts("attention", "plan"):
            # the attention plan, checked here once from the host lists (CPU tensors: no device read);
            # every layer's attention then checks only its tensors against it, not cu_seqlens again
            from rl_engine.ops.attention.op import check_varlen

            row = torch.empty((1, 1, cfg.head_dim), dtype=torch.bfloat16)  # shapes only
            varlen = check_varlen(row.expand(b * s, cfg.num_attention_heads, cfg.head_dim),
                                  *[row.expand(b * (past + s), cfg.num_key_value_heads, cfg.head_dim)] * 2,
                                  torch.tensor(cu, dtype=torch.int32), torch.tensor(cu_k_host, dtype=torch.int32),
                                  cfg.attention_scale, dtype=torch.bfloat16, kernel=True)
        return _Plan(self.ops, cu_q, cu_k, past, tuple(lengths), pos_dev, starts, packed or padded, varlen)


# -- the patched forwards ------------------------------------------------------------------------
def _embedding_forward(h: KernelPatch, mod: torch.nn.Embedding) -> Callable[..., torch.Tensor]:
    def forward(ids: torch.Tensor) -> torch.Tensor:
        flat = ids.reshape(-1)
        y = h.ops("embedding", "embedding", ids=flat, weight=mod.weight)
        if mod.padding_idx is not None:  # nn.Embedding's rule: the padding row gets no gradient (values unchanged)
            y = torch.where((flat == mod.padding_idx)[:, None], y.detach(), y)
        return y.reshape(*ids.shape, y.shape[-1])

    return forward


def _linear_forward(h: KernelPatch, mod: torch.nn.Linear, site: str) -> Callable[..., torch.Tensor]:
    def forward(x: torch.Tensor) -> torch.Tensor:
        y = h.ops(site, "det_gemm", a=x.reshape(-1, x.shape[-1]), b=mod.weight.t())
        return y.reshape(*x.shape[:-1], y.shape[-1])

    return forward


def _lm_head_forward(h: KernelPatch, mod: torch.nn.Linear) -> Callable[..., torch.Tensor]:
    def forward(x: torch.Tensor) -> torch.Tensor:
        y = h.ops("lm_head", "lm_head", hidden=x.reshape(-1, x.shape[-1]), weight=mod.weight)
        return y.reshape(*x.shape[:-1], y.shape[-1])

    return forward


def _norm_forward(h: KernelPatch, mod: torch.nn.Module, site: str) -> Callable[..., torch.Tensor]:
    def forward(x: torch.Tensor) -> torch.Tensor:
        y = h.ops(site, "rms_norm", x=x.reshape(-1, x.shape[-1]), weight=mod.weight, eps=mod.variance_epsilon,
                  order=h.norm_order)
        return y.reshape(x.shape)

    return forward


def _qk_norm_forward(h: KernelPatch, mod: torch.nn.Module, site: str) -> Callable[..., torch.Tensor]:
    def forward(x: torch.Tensor) -> torch.Tensor:  # x [B, S, H, D]
        y = h.ops(site, "qk_norm", x=x.reshape(-1, x.shape[-2], x.shape[-1]), weight=mod.weight,
                  eps=mod.variance_epsilon, order=h.norm_order)
        return y.reshape(x.shape)

    return forward


def _rotary_forward(h: KernelPatch) -> Callable[..., tuple[torch.Tensor, torch.Tensor]]:
    def forward(x: torch.Tensor, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        pos = position_ids.expand(x.shape[0], -1).reshape(-1)
        cos, sin = h.rope_table(pos.device)
        return cos.index_select(0, pos).contiguous(), sin.index_select(0, pos).contiguous()

    return forward


def _mlp_forward(h: KernelPatch, mod: torch.nn.Module, site: str) -> Callable[..., torch.Tensor]:
    def forward(x: torch.Tensor) -> torch.Tensor:
        g = mod.gate_proj(x)
        u = mod.up_proj(x)
        f = g.shape[-1]
        m = h.ops(site + "swiglu", "swiglu", gate=g.reshape(-1, f), up=u.reshape(-1, f))
        return mod.down_proj(m.reshape(*x.shape[:-1], f))

    return forward


def _attention_module_forward(h: KernelPatch, mod: torch.nn.Module, site: str) -> Callable[..., Any]:
    """``Qwen3Attention.forward`` in the chain's op order: q, k, v projections, q_norm, k_norm,
    RoPE of q then k, the registered attention function, o_proj."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    cfg = h.config
    nh, nkv, d = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim

    def forward(hidden_states: torch.Tensor, position_embeddings: tuple[torch.Tensor, torch.Tensor],
                attention_mask: torch.Tensor | None = None, cache: Any = None, **kwargs: Any) -> tuple[Any, Any]:
        if cache is None:
            cache = kwargs.pop("past_key_values", None)
        if kwargs.get("rl_engine_plan") is None:
            raise InputError(f"{site}attention: no rl_engine plan; call the model (or its Qwen3Model) rather than a "
                             f"layer alone, so its inputs are validated first")
        impl = mod.config._attn_implementation
        if impl != ATTN_IMPLEMENTATION:
            raise InputError(f"config._attn_implementation is {impl!r}; the patched attention runs "
                             f"{ATTN_IMPLEMENTATION!r}")
        b, s = hidden_states.shape[:2]
        t = b * s
        q = mod.q_proj(hidden_states)
        k = mod.k_proj(hidden_states)
        v = mod.v_proj(hidden_states)
        q = mod.q_norm(q.view(b, s, nh, d))
        k = mod.k_norm(k.view(b, s, nkv, d))
        cos, sin = position_embeddings
        q = h.ops(site + "q_rope", "rope", x=q.reshape(t, nh, d), cos=cos, sin=sin)
        k = h.ops(site + "k_rope", "rope", x=k.reshape(t, nkv, d), cos=cos, sin=sin)
        q4 = q.view(b, s, nh, d).transpose(1, 2)  # Hugging Face's [B, H, S, D] layout for the interface
        k4 = k.view(b, s, nkv, d).transpose(1, 2)
        v4 = v.view(b, s, nkv, d).transpose(1, 2)
        if cache is not None:
            k_all, v_all = cache.update(k4, v4, mod.layer_idx)
            if kwargs["rl_engine_plan"].past:  # a continuation attends to the cached keys too
                k4, v4 = k_all, v_all
        fn = ALL_ATTENTION_FUNCTIONS[impl]
        out, weights = fn(mod, q4, k4, v4, attention_mask, dropout=0.0 if not mod.training else mod.attention_dropout,
                          scaling=mod.scaling, sliding_window=mod.sliding_window, **kwargs)
        return mod.o_proj(out.reshape(b, s, nh * d)), weights

    return forward


def attention_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                      attention_mask: torch.Tensor | None, scaling: float | None = None, dropout: float = 0.0,
                      sliding_window: int | None = None, rl_engine_plan: _Plan | None = None,
                      **kwargs: Any) -> tuple[torch.Tensor, None]:
    """The attention function registered as ``"rl_engine"`` in ``transformers.AttentionInterface``.

    query [B, H, Sq, D], key / value [B, Hkv, Sk, D] bfloat16 (Hugging Face's layout) -> (out
    [B, Sq, H, D] bfloat16, None). Runs the project's ``attention`` op on the packed tokens
    (``[B * Sq, H, D]``) with the ``cu_seqlens`` of ``rl_engine_plan`` (one sequence per packed
    run of ``position_ids``, padding blocks as sequences of their own; with a cache, queries
    aligned to the end of their row's keys): causal, GQA, FP32 scores and softmax inside the
    kernel, ``scale = scaling`` (Qwen3: ``D ** -0.5``). No attention weights are returned.

    Raises
    ------
    InputError
        No plan (the function runs only inside a model patched by :func:`apply`, which builds
        one per forward); an ``attention_mask`` (the plan carries the padding); ``dropout`` other
        than 0; a sliding window; no ``scaling``.
    """
    if rl_engine_plan is None:
        raise InputError("the rl_engine attention function runs inside a model patched by "
                         "rl_engine.integrations.transformers.apply (its forward builds the packed-sequence plan)")
    if attention_mask is not None:
        raise InputError("attention_mask: the rl_engine attention function takes the padding from its plan, not a "
                         "prepared mask")
    if dropout:
        raise InputError(f"dropout={dropout}: the attention op has no dropout")
    if sliding_window is not None:
        raise InputError(f"sliding_window={sliding_window}: the attention op is full causal attention")
    if scaling is None:
        raise InputError("scaling: required (Qwen3: head_dim ** -0.5)")
    b, nh, sq, d = query.shape
    nkv, sk = key.shape[1], key.shape[2]
    layer = getattr(module, "layer_idx", "?")
    planned = {} if rl_engine_plan.varlen is None else {"plan": rl_engine_plan.varlen}
    out = rl_engine_plan.ops(f"layer{layer}.attention", "attention", q=query.transpose(1, 2).reshape(b * sq, nh, d),
                             k=key.transpose(1, 2).reshape(b * sk, nkv, d),
                             v=value.transpose(1, 2).reshape(b * sk, nkv, d), cu_seqlens_q=rl_engine_plan.cu_q,
                             cu_seqlens_k=rl_engine_plan.cu_k, scale=float(scaling), **planned)
    return out.view(b, sq, nh, d), None


def _base_forward(h: KernelPatch, orig: Callable[..., Any]) -> Callable[..., Any]:
    """``Qwen3Model.forward``, preceded by :meth:`KernelPatch.plan` (every check before any op)."""

    # transformers renamed the cache argument (``past_key_values`` up to 5.1x, ``cache`` since): the
    # patched forward takes either and hands it on under the installed version's name
    cache_name = "cache" if "cache" in inspect.signature(orig).parameters else "past_key_values"

    def forward(input_ids: torch.Tensor | None = None, attention_mask: torch.Tensor | None = None,
                position_ids: torch.Tensor | None = None, cache: Any = None,
                inputs_embeds: torch.Tensor | None = None, use_cache: bool | None = None, **kwargs: Any) -> Any:
        other = kwargs.pop("past_key_values", None)
        if cache is not None and other is not None:
            raise InputError("pass the KV cache once: both cache= and past_key_values= were given")
        cache = cache if cache is not None else other
        if "rl_engine_plan" in kwargs:
            raise InputError("rl_engine_plan: built by the patched forward from its inputs; do not pass one")
        plan = h.plan(input_ids, inputs_embeds, attention_mask, position_ids, cache, use_cache, kwargs)
        if plan.packed_or_padded:
            use_cache = False
        kwargs[cache_name] = cache
        return orig(input_ids=input_ids, attention_mask=None, position_ids=plan.positions,
                    inputs_embeds=inputs_embeds, use_cache=use_cache, rl_engine_plan=plan, **kwargs)

    return forward


# -- apply / undo --------------------------------------------------------------------------------
def _check_structure(base: Any, causal: Any | None, cfg: Qwen3Config) -> list[tuple[str, torch.nn.Module]]:
    """Every module apply() replaces the forward of, after checking its type (exact: a subclass or a
    wrapper such as a LoRA layer may compute something else) and that nothing replaced its forward
    before (accelerate hooks, another patch)."""
    m = _hf()
    linear, emb = torch.nn.Linear, torch.nn.Embedding
    want: list[tuple[str, torch.nn.Module, type]] = [("model.embed_tokens", base.embed_tokens, emb),
                                                      ("model.rotary_emb", base.rotary_emb, m.Qwen3RotaryEmbedding)]
    if len(base.layers) != cfg.num_hidden_layers:
        raise InputError(f"model.layers: {len(base.layers)} layers, the config says {cfg.num_hidden_layers}")
    for i, layer in enumerate(base.layers):
        p = f"model.layers.{i}"
        a, mlp = layer.self_attn, layer.mlp
        want += [(f"{p}.self_attn", a, m.Qwen3Attention), (f"{p}.mlp", mlp, m.Qwen3MLP),
                 (f"{p}.input_layernorm", layer.input_layernorm, m.Qwen3RMSNorm),
                 (f"{p}.post_attention_layernorm", layer.post_attention_layernorm, m.Qwen3RMSNorm),
                 (f"{p}.self_attn.q_norm", a.q_norm, m.Qwen3RMSNorm),
                 (f"{p}.self_attn.k_norm", a.k_norm, m.Qwen3RMSNorm)]
        want += [(f"{p}.self_attn.{n}", getattr(a, n), linear) for n in ("q_proj", "k_proj", "v_proj", "o_proj")]
        want += [(f"{p}.mlp.{n}", getattr(mlp, n), linear) for n in ("gate_proj", "up_proj", "down_proj")]
    want.append(("model.norm", base.norm, m.Qwen3RMSNorm))
    if causal is not None:
        want.append(("lm_head", causal.lm_head, linear))
    for name, mod, cls in want:
        if type(mod) is not cls:
            raise InputError(f"{name}: expected {cls.__qualname__}, got "
                             f"{type(mod).__module__}.{type(mod).__qualname__} (adapters such as LoRA layers, or "
                             f"subclasses, are not routed)")
        if "forward" in mod.__dict__:
            raise InputError(f"{name}: its forward was already replaced (accelerate hooks, another kernel patch); "
                             f"apply() runs on a plain transformers model")
        if isinstance(mod, linear) and mod.bias is not None:
            raise InputError(f"{name}: has a bias; the project's Qwen3 projections have none")
        if isinstance(mod, m.Qwen3RMSNorm) and mod.variance_epsilon != cfg.rms_norm_eps:
            raise InputError(f"{name}: eps {mod.variance_epsilon} differs from the config's rms_norm_eps "
                             f"{cfg.rms_norm_eps}")
    e = base.embed_tokens
    if e.max_norm is not None or e.scale_grad_by_freq or e.sparse:
        raise InputError("model.embed_tokens: max_norm, scale_grad_by_freq and sparse are not supported")
    if "forward" in base.__dict__:
        raise InputError("model: its forward was already replaced (accelerate hooks, another patch)")
    if getattr(base.rotary_emb, "attention_scaling", 1.0) != 1.0:
        raise InputError(f"model.rotary_emb: attention_scaling {base.rotary_emb.attention_scaling} (scaled RoPE) is "
                         f"not supported")
    return [(n, mod) for n, mod, _ in want]


def apply(model: Any, backend: str = "triton_cuda_bf16") -> KernelPatch:
    """Route a ``transformers`` Qwen3 model through the project's ops on ``backend``, in place.

    ``model``: ``transformers.Qwen3ForCausalLM`` or ``Qwen3Model`` with bfloat16 parameters on
    one device (a CUDA device, or the CPU with the Triton interpreter for ``triton_cuda_bf16``).
    ``backend``: ``"triton_cuda_bf16"`` or ``"cuda_bf16"``. Afterwards ``model(...)`` runs the
    table of the module docstring with autograd (every op has its backward), ``lm_head`` returns
    FP32 logits [B, S, V] (Hugging Face returns BF16; its loss upcasts them anyway), and
    :func:`logprobs` gives the chain's per-token FP32 logprobs. Returns a :class:`KernelPatch`;
    ``handle.undo()``, :func:`undo` or leaving ``with apply(...)`` puts everything back.

    Every check runs before anything is changed (a refused model is left as it was) and no op
    runs during apply.

    Raises
    ------
    InputError
        Not a Qwen3ForCausalLM / Qwen3Model; already patched (this model or the one around /
        inside it); a parameter that is not bfloat16, or parameters on several devices; a module
        that is not the plain transformers type (a LoRA layer, a subclass), already has its forward
        replaced, or has a bias; an untied head where the config ties it.
    RLEngineError, BackendUnavailable
        An unknown backend or one that is not a kernel backend; a backend that cannot run here or
        on the model's device (the message says why); transformers missing or older than 5.
    ConfigError
        A config feature the chain cannot represent (:func:`qwen3_config`).
    WeightError
        A parameter of the wrong shape for the config (naming it).
    """
    from rl_engine.backends.registry import KERNEL_BACKENDS, check_backend
    from rl_engine.ops._torch_op import check_device

    base, causal = _split(model)
    for m in (model, base):
        if patch_of(m) is not None:
            raise InputError(f"{type(m).__qualname__} is already patched by rl_engine (apply() twice); call undo() "
                             f"first")
    if not isinstance(backend, str) or backend not in KERNEL_BACKENDS:
        raise RLEngineError(f"backend must be one of {', '.join(KERNEL_BACKENDS)} (the kernel backends), got "
                            f"{backend!r}")
    cfg = qwen3_config(model.config)
    devices = set()
    for name, p in model.named_parameters():
        if p.dtype != torch.bfloat16:
            raise InputError(f"{name}: dtype {str(p.dtype).replace('torch.', '')}; apply() runs on bfloat16 "
                             f"parameters (model.to(torch.bfloat16)); nothing is cast")
        devices.add(p.device)
    if len(devices) != 1:
        raise InputError(f"parameters on several devices {sorted(map(str, devices))}; apply() needs one")
    modules = _check_structure(base, causal, cfg)
    if causal is not None or cfg.tie_word_embeddings:
        qwen3_weights(model)  # shapes, dtypes and the tied head, each problem naming its tensor
    check_backend(backend)
    check_device(backend, base.embed_tokens.weight)
    from rl_engine.contract import load_contract

    ops = OpTable(backend).resolve(MODEL_OPS)
    h = KernelPatch(model, base, causal, backend, ops, cfg, load_contract().rms_norm_order)
    _register_attention()
    h.active = True
    try:
        hf = _hf()
        for name, mod in modules:
            site = _site(name)
            if mod is base.embed_tokens:
                h._set_forward(mod, _embedding_forward(h, mod))
            elif mod is base.rotary_emb:
                h._set_forward(mod, _rotary_forward(h))
            elif causal is not None and mod is causal.lm_head:
                h._set_forward(mod, _lm_head_forward(h, mod))
            elif isinstance(mod, torch.nn.Linear):
                h._set_forward(mod, _linear_forward(h, mod, site))
            elif isinstance(mod, hf.Qwen3RMSNorm):
                qk = name.endswith(("q_norm", "k_norm"))
                h._set_forward(mod, (_qk_norm_forward if qk else _norm_forward)(h, mod, site))
            elif isinstance(mod, hf.Qwen3MLP):
                h._set_forward(mod, _mlp_forward(h, mod, site))
            elif isinstance(mod, hf.Qwen3Attention):
                h._set_forward(mod, _attention_module_forward(h, mod, site))
        h._set_forward(base, _base_forward(h, type(base).forward.__get__(base)))
        seen: set[int] = set()
        for sub in model.modules():
            c = getattr(sub, "config", None)
            if c is not None and hasattr(c, "_attn_implementation_internal") and id(c) not in seen:
                seen.add(id(c))
                h._attn_saved.append((c, c._attn_implementation_internal))
        model.set_attn_implementation(ATTN_IMPLEMENTATION)
        if base.config._attn_implementation != ATTN_IMPLEMENTATION:
            raise RLEngineError(f"transformers did not accept attn_implementation={ATTN_IMPLEMENTATION!r} (got "
                                f"{base.config._attn_implementation!r})")
    except BaseException:
        h.undo()
        raise
    _PATCHED[model] = _PATCHED[base] = weakref.ref(h)
    return h


def _site(name: str) -> str:
    """The chain's site name of a module path: ``model.layers.3.self_attn.q_proj`` ->
    ``layer3.q_proj``; a module that holds several sites gives its prefix (``layer3.``)."""
    if name == "model.norm":
        return "final_norm"
    if name.startswith("model.layers."):
        rest = name[len("model.layers."):]
        idx, _, tail = rest.partition(".")
        leaf = tail.split(".")[-1]
        return f"layer{idx}." + ("" if leaf in ("self_attn", "mlp") else leaf)
    return name.split(".")[-1]


def _register_attention() -> None:
    from transformers import AttentionInterface

    AttentionInterface.register(ATTN_IMPLEMENTATION, attention_forward)


def patch_of(model: Any) -> KernelPatch | None:
    """The active :class:`KernelPatch` of ``model`` (the model :func:`apply` was given, or the
    ``Qwen3Model`` inside it), or None."""
    ref = _PATCHED.get(model)
    return None if ref is None else ref()


def undo(model: Any) -> None:
    """Undo :func:`apply` on ``model`` (see :meth:`KernelPatch.undo`).

    Raises
    ------
    InputError
        ``model`` is not patched.
    """
    h = patch_of(model)
    if h is None:
        raise InputError(f"{type(model).__qualname__} is not patched by rl_engine")
    h.undo()


# -- logprobs ------------------------------------------------------------------------------------
class TokenLogprobs(NamedTuple):
    """``logprobs`` [B, S-1] float32: entry ``[b, t]`` is ``log p(input_ids[b, t+1] | the tokens of
    its sequence up to t)``; 0.0 where ``mask`` is False. ``mask`` [B, S-1] bool: the target
    ``t + 1`` is a real token of the same sequence as ``t`` (not padding, not the first token of
    the next packed sequence)."""

    logprobs: torch.Tensor
    mask: torch.Tensor


def logprobs(model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
             position_ids: torch.Tensor | None = None, *, head: str = "lm_head_logp",
             temperature: float = 1.0) -> TokenLogprobs:
    """Per-token FP32 logprobs of ``input_ids`` [B, S] int64 by teacher forcing, on a model patched
    by :func:`apply`: the chain's composition (:func:`rl_engine.chain.scoring.score_teacher_forcing`)
    — the patched ``Qwen3Model`` forward, the final hidden rows that predict a real token
    (``index_select``), then the logprob head on those rows only.

    ``head="lm_head_logp"`` (default): ``logp(lm_head(h, W) [N, V] fp32, targets, temperature)``,
    the head the rollout engine's sampler uses (``docs/rollout.md``); ``head="linear_logp"``: the
    fused ``linear_logp`` (no [N, V] buffer). Logits are FP32 in both and never rounded to BF16;
    max, sum-exp and the output are FP32. ``attention_mask`` / ``position_ids`` as for the
    patched forward (right padding, packed runs). Differentiable w.r.t. every parameter.

    Returns
    -------
    TokenLogprobs
        ``(logprobs [B, S-1] float32, mask [B, S-1] bool)``; ``logprobs[mask]`` is in the chain's
        active-token order (row by row, token by token).

    Raises
    ------
    InputError
        ``model`` is not a patched Qwen3ForCausalLM; an unknown ``head``; any input
        :meth:`KernelPatch.plan` refuses (before any op runs); targets out of range (the head's own
        check).
    """
    h = patch_of(model)
    if h is None or h.causal is not model:
        raise InputError("logprobs: expected a Qwen3ForCausalLM patched by rl_engine.integrations.transformers.apply")
    if head not in HEADS:
        raise InputError(f"head must be one of {HEADS}, got {head!r}")
    plan = h.plan(input_ids, None, attention_mask, position_ids, None, False, {})
    b, s = input_ids.shape
    lengths = torch.tensor(plan.lengths)
    t = torch.arange(1, s)
    mask = (t[None, :] < lengths[:, None]) & ~plan.starts[:, 1:]  # [B, S-1] (CPU)
    flat = mask.reshape(-1).nonzero()[:, 0]
    bi, ti = flat // max(s - 1, 1), flat % max(s - 1, 1)
    rows = (bi * s + ti).to(h.device)
    out = torch.zeros(b * (s - 1), dtype=torch.float32, device=h.device)
    if rows.numel() == 0:
        return TokenLogprobs(out.view(b, s - 1), mask.to(h.device))
    hidden = model.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                         use_cache=False).last_hidden_state
    hs = hidden.reshape(b * s, -1).index_select(0, rows)
    targets = input_ids.reshape(-1).index_select(0, rows + 1)
    weight = model.lm_head.weight
    if head == "linear_logp":
        lp = h.ops("logp", "linear_logp", hidden=hs, weight=weight, targets=targets, temperature=temperature)
    else:
        logits = h.ops("lm_head", "lm_head", hidden=hs, weight=weight)
        lp = h.ops("logp", "logp", logits=logits, targets=targets, temperature=temperature)
    if lp.dtype != torch.float32:
        raise RLEngineError(f"{head} on {h.backend} returned {lp.dtype}; logprobs must be float32")
    out = out.index_put((flat.to(h.device),), lp)
    return TokenLogprobs(out.view(b, s - 1), mask.to(h.device))
