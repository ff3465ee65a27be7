"""The Qwen3 dense model, built only from the project's ops, and its static KV cache.

Shape glossary: B batch (sequences), S_max KV-cache slots, T packed tokens, N scored rows,
E hidden, F ffn, H query heads, Hkv KV heads, D head dim, V vocab.

One :meth:`Qwen3Model.forward` serves

* **packed varlen** calls (``cu_seqlens``): training-style teacher forcing over whole sequences,
  and the rollout-style prefill of the prompts (which also writes K/V into a :class:`KVCache`);
* **decode** calls: one token for each of the B sequences against the static KV cache.

Every op comes from the model's :class:`OpTable`, which resolves ``op`` on the chosen backend
through the backend registry (:func:`rl_engine.backends.registry.check_backend`) on first use, with
the signatures of ``docs/ops-api.md``: ``embedding``, ``rms_norm`` (the contract's rounding order),
``det_gemm`` for every projection as ``x @ W.T`` with ``b = W.t()`` (a transposed view, no copy),
``qk_norm``, ``rope`` with FP32 cos/sin from ``rl_engine.ops.rope.cos_sin``, ``attention`` /
``attention_decode``, ``swiglu``, and the logprob head ``linear_logp`` (or ``lm_head`` + ``logp``).
Residual adds are plain tensor adds in the execution dtype (BF16 for kernel backends, as Hugging
Face does). ``reference_fp32`` runs the whole model in FP32 on upcast weights.

Each op call names its site (``"q_proj"``, ``"attn_residual"``, ...): the plain table ignores it;
the recording table of :mod:`rl_engine.chain.scoring` hands every output to a recorder under
``layer{i}.{site}`` (first-divergence localisation), so the forward carries no recording code.

K and V enter the cache after RoPE, rounded to the execution dtype exactly once (by the rope /
projection op that produced them), and the prefill attention reads those same values
(``docs/pitfalls.md`` P8).

A decode step does not read a device value on the host once its inputs are validated: callers
that validated a whole plan (positions below ``S_max`` and the RoPE table) pass ``checked=True``
(``score_rollout``, the rollout engine), and the step is then free of host syncs.

Math source: ``transformers/models/qwen3/modeling_qwen3.py`` (Qwen3DecoderLayer, Qwen3Attention,
Qwen3MLP, Qwen3RMSNorm, rotate-half RoPE).
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from rl_engine.backends.registry import check_backend
from rl_engine.chain.config import Qwen3Config
from rl_engine.chain.weights import Qwen3Weights
from rl_engine.errors import InputError, RLEngineError
from rl_engine.provenance import kernel_id

HEADS = ("linear_logp", "lm_head_logp")
MODEL_OPS = ("embedding", "rms_norm", "det_gemm", "qk_norm", "rope", "attention", "attention_decode", "swiglu",
             "lm_head", "logp", "linear_logp")
"""Every op a forward or a head may call (resolved when the model is built)."""

LAYER_OP_ORDER = (
    "input_layernorm", "q_proj", "k_proj", "v_proj", "q_norm", "k_norm", "q_rope", "k_rope",
    "attention", "o_proj", "attn_residual", "post_attention_layernorm", "gate_proj", "up_proj",
    "swiglu", "down_proj", "mlp_residual",
)
"""The op sites of one decoder layer, in forward order (first-divergence localisation)."""


def _add(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return a + b


class OpTable:
    """The op implementations of one backend, resolved through the registry on first use.

    ``table(site, op, **kwargs)`` runs ``op`` (``site`` is for wrappers, see module docstring).
    ``add`` is the residual add, a plain tensor add. :meth:`replace` gives a table with some
    implementations swapped (the row-parallel model, negative controls).

    Raises
    ------
    BackendUnavailable, RLEngineError
        On construction, the backend is unknown or cannot run here; on first use of an op, the
        backend does not provide it.
    """

    def __init__(self, backend: str, impls: Mapping[str, Callable[..., Any]] | None = None,
                 resolved: Mapping[str, Callable[..., Any]] | None = None):
        self.backend = backend
        self._backend = check_backend(backend)
        self._impls: dict[str, Callable[..., Any]] = dict(impls or {})  # the ops this table has run
        self._resolved: dict[str, Callable[..., Any]] = dict(resolved or {})  # looked up ahead (resolve)
        self._accepts: dict[tuple[int, str], bool] = {}

    def impl(self, op: str) -> Callable[..., Any]:
        fn = self._impls.get(op)
        if fn is None:
            fn = self._resolved.get(op) or (_add if op == "add" else self._backend.impl(op))
            self._impls[op] = fn
        return fn

    def __call__(self, site: str, op: str, **kwargs: Any) -> torch.Tensor:
        return self.impl(op)(**kwargs)

    def has(self, op: str) -> bool:
        """Whether the table was given ``op`` (a fused launch of :mod:`rl_engine.chain.fused`);
        nothing is looked up in the registry."""
        return op in self._impls or op in self._resolved

    def accepts(self, op: str, param: str) -> bool:
        """Whether ``op``'s implementation takes the keyword ``param`` (e.g. attention's ``plan``:
        the kernel backends' entry points take it, the comparison paths and most test doubles do
        not). Looks the op up like a call would; the answer is cached per implementation."""
        fn = self.impl(op)
        key = (id(fn), param)
        hit = self._accepts.get(key)
        if hit is None:
            try:
                params = inspect.signature(fn, follow_wrapped=False).parameters  # a wrapper's own signature
            except (TypeError, ValueError):  # a builtin without a signature: pass nothing extra
                params = {}
            hit = param in params
            self._accepts[key] = hit
        return hit

    def resolve(self, ops: tuple[str, ...]) -> OpTable:
        """Look up ``ops`` now instead of on first use (an op the backend does not provide still
        raises on first use), so a forward under ``torch.compile`` finds every implementation
        resolved: the registry's lookup imports modules, which dynamo cannot trace."""
        from rl_engine.errors import BackendUnavailable

        for op in ops:
            if op not in self._impls and op not in self._resolved:
                try:
                    self._resolved[op] = self._backend.impl(op)
                except BackendUnavailable:
                    pass
        return self

    def scope(self, prefix: str) -> OpTable:
        """The table for the sites of one layer (the plain table has no use for the prefix)."""
        return self

    def replace(self, **impls: Callable[..., Any]) -> OpTable:
        return OpTable(self.backend, {**self._impls, **impls}, {k: v for k, v in self._resolved.items() if k not in impls})

    def kernel_ids(self) -> dict[str, str]:
        """``op -> op/backend/function@source-hash`` for every op this table has run."""
        return {op: kernel_id(op, self.backend, fn) for op, fn in sorted(self._impls.items()) if op != "add"}


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


@dataclass(frozen=True)
class _Step:
    """Where one forward call writes and reads the cache (built by :meth:`Qwen3Model._step`)."""

    rows: torch.Tensor | None  # cache row of every token, [T] (None: no cache)
    cache_seqlens: torch.Tensor | None  # decode: int32 [B] = positions + 1


def _packed_halves(w_gate: torch.Tensor, w_up: torch.Tensor) -> torch.Tensor | None:
    """The ``[2F, E]`` tensor whose rows 0 .. F - 1 are ``w_gate`` and F .. 2F - 1 ``w_up`` (both
    ``[F, E]``, unit stride along E, ``w_up`` directly after ``w_gate`` in one storage: the packed
    weight's two slices), as a view; None when they are not laid out so."""
    ffn = w_gate.shape[0]
    if (w_gate.shape != w_up.shape or w_gate.stride() != w_up.stride() or w_gate.dtype != w_up.dtype
            or w_gate.stride(-1) != 1 or w_gate.untyped_storage().data_ptr() != w_up.untyped_storage().data_ptr()
            or w_up.storage_offset() != w_gate.storage_offset() + ffn * w_gate.stride(0)):
        return None
    return w_gate.as_strided((2 * ffn, w_gate.shape[1]), w_gate.stride())


class Qwen3Model:
    """Qwen3 dense model on one backend.

    ``weights`` are BF16 (:class:`Qwen3Weights`); for ``reference_fp32`` they are upcast to FP32
    once here (the same values). ``norm_order`` is the RMSNorm rounding order the contract
    declares (``contract.rms_norm_order``, ``hf``); when left out it is read from the contract
    file, for callers that have no contract in hand.

    Raises
    ------
    BackendUnavailable
        The backend cannot run here.
    InputError
        Weights in an unexpected dtype.
    """

    def __init__(self, weights: Qwen3Weights, backend: str, *, norm_order: str | None = None):
        self.ops = OpTable(backend).resolve(MODEL_OPS)
        self.backend = backend
        self.config = weights.config
        if norm_order is None:  # a public entry point: the contract is read here when not handed in
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
        self._packed: list | None = None

    def packed_projections(self) -> list:
        """Per layer, the q/k/v and gate/up weights stacked into one tensor each
        (:func:`rl_engine.chain.weights.pack_projections`, done once, no extra memory), for
        ``forward(packed=True)``."""
        if self._packed is None:
            from rl_engine.chain.weights import pack_projections

            self._packed = [pack_projections(lw) for lw in self.weights.layers]
        return self._packed

    def capture_safe_ops(self) -> OpTable:
        """The op table with the three checks that read device values left out: ``embedding``
        (ids in ``[0, V)``), ``attention_decode`` (``cache_seqlens`` in ``[0, S_max]``) and ``logp``
        (targets in ``[0, V)``) run with ``validate=False``; every shape, dtype and device check
        stays. For a decode step captured in a CUDA graph or compiled (a host read of a device value
        cannot be captured): the caller guarantees those values, e.g. ids and positions the engine's
        plan validated on the host, tokens drawn by ``argmax`` over ``[0, V)``.

        Raises
        ------
        InputError
            The backend is not a kernel backend (only those have the ``validate=False`` forms).
        """
        from rl_engine.backends.registry import KERNEL_BACKENDS
        from rl_engine.ops.attention.api import attention_decode_kernel, attention_kernel
        from rl_engine.ops.embedding.api import embedding_kernel
        from rl_engine.ops.logp.api import logp_kernel

        if self.backend not in KERNEL_BACKENDS:
            raise InputError(f"capture_safe_ops: {self.backend} is not a kernel backend ({', '.join(KERNEL_BACKENDS)})")
        b = self.backend
        return self.ops.replace(
            embedding=lambda ids, weight: embedding_kernel(ids, weight, backend=b, validate=False),
            attention=lambda plan=None, **kw: attention_kernel(**kw, backend=b, plan=plan),
            attention_decode=lambda **kw: attention_decode_kernel(**kw, backend=b, validate=False),
            logp=lambda **kw: logp_kernel(**kw, backend=b, validate=False))

    def training_ops(self) -> OpTable:
        """The op table with the differentiable fused launches of training: the residual add +
        RMSNorm (:func:`rl_engine.ops.rms_norm.add_rms_norm_kernel`: each residual add runs inside
        the next norm) and QK-norm + RoPE (:func:`rl_engine.ops.qk_norm.op.qk_norm_rope_kernel`:
        one launch for q and one for k forward), the same bits as :attr:`ops` forward and backward
        (tested). On both backends the backward adds the residual gradient in the norm's dx store
        and rotates the q / k gradients back inside the norm's backward loads: 4 launches fewer per
        layer forward (``cuda_bf16`` since its norm kernels have the fused forms too; above their
        row limits it runs the separate launches, the same bits). The attention and the sites of the
        other norms are unchanged; the ``attn_residual`` / ``mlp_residual`` sites and the q / k norm
        and rope sites become the norms' and ``qk_norm_rope``. Calls without gradients
        (``torch.no_grad``: teacher forcing for scoring) run the gate / up projections and SwiGLU
        as one ``gate_up_swiglu`` site, the same bits: on ``triton_cuda_bf16``
        :func:`rl_engine.ops.det_gemm.triton.det_gemm_swiglu_launch` (its fused kernel only where
        ``GATE_UP_SWIGLU_ON_CUDA`` allows, otherwise two det_gemm launches, one per weight even for
        packed weights, then swiglu); on ``cuda_bf16``
        :func:`rl_engine.ops.det_gemm.cuda.det_gemm_swiglu_launch` for packed weights (one launch
        where ``GATE_UP_SWIGLU_FUSED`` allows, otherwise the packed product then swiglu), two
        products then swiglu for separate ones. With gradients the MLP is unchanged.

        Raises
        ------
        InputError
            The backend is not a kernel backend. When the table runs: its ``qk_norm_rope`` given a
            KV cache (the rollout form is :meth:`decode_ops`'s), or q / k inputs the fused op
            refuses (both checked before either launch).
        """
        from rl_engine.backends.registry import KERNEL_BACKENDS
        from rl_engine.ops.qk_norm.op import check_qk_norm_rope, qk_norm_rope_kernel
        from rl_engine.ops.rms_norm.op import add_rms_norm_kernel

        if self.backend not in KERNEL_BACKENDS:
            raise InputError(f"training_ops: {self.backend} is not a kernel backend ({', '.join(KERNEL_BACKENDS)})")
        b = self.backend

        def qk_norm_rope(q, k, v, q_weight, k_weight, eps, order, cos, sin, **cached):
            if cached:
                raise InputError("training_ops: the training QK-norm + RoPE writes no KV cache; decode_ops() has "
                                 "the rollout form")
            check_qk_norm_rope(q, q_weight, eps, order, cos, sin)
            check_qk_norm_rope(k, k_weight, eps, order, cos, sin)
            return (qk_norm_rope_kernel(q, q_weight, eps, order, cos, sin, backend=b, validate=False),
                    qk_norm_rope_kernel(k, k_weight, eps, order, cos, sin, backend=b, validate=False))

        extra = {}
        if b == "triton_cuda_bf16":
            from rl_engine.ops.det_gemm import triton as dg
            from rl_engine.ops.det_gemm.topology import check_contract_topology

            def gate_up_swiglu(a, w_gate, w_up):
                # [T, E] @ [F, E]^T twice, then swiglu, with the det_gemm op's declared tree (checked
                # against the contract as the op checks it on every call)
                check_contract_topology(dg.TREE_DEPTH, "the Triton det_gemm kernel")
                return dg.det_gemm_swiglu_launch(a, w_gate.t(), w_up.t(), dg.TREE_DEPTH)

            extra["gate_up_swiglu"] = gate_up_swiglu
        else:  # cuda_bf16
            from rl_engine.ops.det_gemm import cuda as dg_cuda
            from rl_engine.ops.det_gemm.topology import check_contract_topology
            from rl_engine.ops.swiglu.cuda import swiglu_fwd

            def gate_up_swiglu(a, w_gate, w_up):
                # the packed [gate; up] weight's two halves: one product [T, 2F] (or, with
                # dg_cuda.GATE_UP_SWIGLU_FUSED, one launch that writes only swiglu's output);
                # separate weights: two products, then swiglu (the same bits either way)
                check_contract_topology(dg_cuda.TREE_DEPTH, "the CUDA det_gemm kernel")
                packed = _packed_halves(w_gate, w_up)
                if packed is not None:
                    return dg_cuda.det_gemm_swiglu_launch(a, packed.t(), dg_cuda.TREE_DEPTH)
                return swiglu_fwd(dg_cuda.det_gemm_launch(a, w_gate.t(), dg_cuda.TREE_DEPTH),
                                  dg_cuda.det_gemm_launch(a, w_up.t(), dg_cuda.TREE_DEPTH))

            extra["gate_up_swiglu"] = gate_up_swiglu
        return self.ops.replace(add_rms_norm=lambda **kw: add_rms_norm_kernel(**kw, backend=b),
                                qk_norm_rope=qk_norm_rope, **extra)

    def decode_ops(self) -> OpTable:
        """:meth:`capture_safe_ops` plus the backend's fused launches of
        :mod:`rl_engine.chain.fused` (residual add + RMSNorm; qk_norm, RoPE and the K/V cache write):
        the rollout engine's table. Same bits as :meth:`capture_safe_ops` (tested); fewer launches
        per layer. Raises as :meth:`capture_safe_ops`."""
        from rl_engine.chain.fused import fused_decode_impls

        return self.capture_safe_ops().replace(**fused_decode_impls(self.backend))

    def varlen_plan(self, cu_seqlens: torch.Tensor, tokens: int) -> Any:
        """The attention :class:`~rl_engine.ops.attention.VarlenPlan` of a packed varlen forward over
        ``tokens`` tokens split by ``cu_seqlens`` int32 [B+1] (reads cu_seqlens on the host once):
        hand it to :meth:`forward` with the :meth:`capture_safe_ops` table, and that forward reads
        no device value (``torch.compile(fullgraph=True)``).

        Raises
        ------
        InputError
            cu_seqlens malformed or not ending at ``tokens``.
        """
        from rl_engine.ops.attention.op import check_varlen

        cfg = self.config
        row = torch.empty((1, 1, cfg.head_dim), dtype=torch.bfloat16, device=cu_seqlens.device)  # shapes only
        q = row.expand(tokens, cfg.num_attention_heads, cfg.head_dim)
        kv = row.expand(tokens, cfg.num_key_value_heads, cfg.head_dim)
        return check_varlen(q, kv, kv, cu_seqlens, cu_seqlens, cfg.attention_scale, dtype=torch.bfloat16,
                            kernel=True)

    # -- inputs ----------------------------------------------------------------------------------
    def check_positions(self, lo: int, hi: int, s_max: int | None = None, what: str = "positions") -> None:
        """Validate a plan's position range ``[lo, hi]`` once, on the host (no device read):
        inside the RoPE table and, with ``s_max``, inside the cache."""
        if lo < 0 or hi >= self.config.max_position_embeddings:
            raise InputError(f"{what}: range [{lo}, {hi}] outside [0, max_position_embeddings="
                             f"{self.config.max_position_embeddings})")
        if s_max is not None and hi >= s_max:
            raise InputError(f"{what}: position {hi} beyond the cache's S_max={s_max}")

    def _check_device_positions(self, positions: torch.Tensor, s_max: int | None, what: str) -> None:
        if positions.numel():  # reads two device values: the unvalidated path only
            self.check_positions(int(positions.min()), int(positions.max()), s_max, what)

    def rope_tables(self, positions: torch.Tensor, *, checked: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin [T, D/2] float32 for ``positions`` [T] int64.

        Rows of one table ``cos_sin(arange(max_position_embeddings))`` built once per model, so a
        position gets the same bits in every call (whatever the batch around it). Unless
        ``checked``, the positions are validated first (InputError outside the table).
        """
        from rl_engine.ops.rope import cos_sin

        if self._rope_table is None:
            pos = torch.arange(self.config.max_position_embeddings, dtype=torch.int64, device=self.device)
            self._rope_table = cos_sin(pos, self.config.rope_theta, self.config.head_dim)
        if not checked:
            self._check_device_positions(positions, None, "positions")
        cos, sin = self._rope_table
        return cos.index_select(0, positions).contiguous(), sin.index_select(0, positions).contiguous()

    def _step(self, ids: torch.Tensor, positions: torch.Tensor, cu_seqlens: torch.Tensor | None,
              cache: KVCache | None, decode: bool, checked: bool) -> _Step:
        t = int(ids.shape[0])
        if ids.dim() != 1 or positions.shape != ids.shape:
            raise InputError(f"ids and positions must be [T] of one length, got {list(ids.shape)} and "
                             f"{list(positions.shape)}")
        if decode:
            if cache is None:
                raise InputError("decode=True needs a KV cache")
            if t != cache.batch:
                raise InputError(f"decode: {t} tokens for a cache of batch {cache.batch}; one token per sequence")
            if not checked:
                self._check_device_positions(positions, cache.s_max, "decode")
            return _Step(torch.arange(t, device=ids.device), (positions + 1).to(torch.int32))
        if cu_seqlens is None:
            raise InputError("a packed varlen forward needs cu_seqlens")
        if not checked:
            self._check_device_positions(positions, None if cache is None else cache.s_max, "prefill")
        if cache is None:
            return _Step(None, None)
        lens = cu_seqlens[1:] - cu_seqlens[:-1]
        if lens.numel() != cache.batch:
            raise InputError(f"prefill: {lens.numel()} sequences for a cache of batch {cache.batch}")
        return _Step(torch.repeat_interleave(torch.arange(lens.numel(), device=ids.device), lens.long()), None)

    # -- the forward -------------------------------------------------------------------------------
    def forward(self, ids: torch.Tensor, positions: torch.Tensor, *, cu_seqlens: torch.Tensor | None = None,
                cache: KVCache | None = None, decode: bool = False, checked: bool = False,
                ops: OpTable | None = None, plan: Any = None, packed: bool = False) -> torch.Tensor:
        """Run the decoder stack and the final norm. Returns hidden [T, E] (execution dtype).

        Packed varlen (``decode=False``): ids, positions [T] int64 (positions restart at 0 in each
        sequence), ``cu_seqlens`` int32 [B+1]; causal attention within each sequence. With
        ``cache`` (B rows), token ``t`` of sequence ``b`` also writes its K/V (after RoPE) to
        ``cache.k[l][b, positions[t]]`` — the rollout prefill.

        Decode (``decode=True``): ids, positions [B] int64, one token per sequence, ``cache``
        required; K/V of the token are written to slot ``positions[b]``, then
        ``attention_decode(q [B, H, D], k_cache, v_cache, cache_seqlens=positions + 1, scale)``.

        ``checked=True``: the caller has validated the positions (:meth:`check_positions`); no
        device value is read on the host. ``ops``: the op table to run (default ``self.ops``).
        ``plan``: the :meth:`varlen_plan` of ``cu_seqlens`` for a packed call: attention then does
        not read cu_seqlens again. Left out, a packed call whose table's attention takes a plan (the
        kernel backends' tables) builds it here, reading cu_seqlens on the host once instead of once
        per layer (each read is a host synchronisation that stalls the launch queue). ``packed=True``: q/k/v as one ``det_gemm`` over the stacked weight (site
        ``qkv_proj``) and gate/up as one (site ``gate_up_proj``), their outputs used as column
        slices (:meth:`packed_projections`): two launches instead of five per layer, the same
        bits (each output element is the same reduction). The rollout engine runs this form; the
        sites then differ from the unpacked form's (recording and tensor-parallel tables use
        the unpacked form).

        Raises
        ------
        InputError
            Inconsistent shapes, positions outside the cache or the RoPE table.
        """
        f = ops or self.ops
        step = self._step(ids, positions, cu_seqlens, cache, decode, checked)
        accepts = getattr(f, "accepts", None)  # a duck-typed table without it: attention reads cu_seqlens itself
        if plan is None and not decode and accepts is not None and accepts("attention", "plan"):
            plan = self.varlen_plan(cu_seqlens, int(ids.shape[0]))  # cu_seqlens read once, not once per layer
        cos, sin = self.rope_tables(positions, checked=True)
        scope: contextlib.AbstractContextManager[None] = contextlib.nullcontext()
        if decode:
            from rl_engine.chain.fused import decode_launch_scope

            scope = decode_launch_scope(self.backend, self.device, int(ids.shape[0]))
        with scope:  # cuda_bf16 decode: programmatic dependent launch (rl_engine.chain.fused.CUDA_DECODE_PDL)
            x = f("embedding", "embedding", ids=ids, weight=self.weights.embed_tokens)
            packs = self.packed_projections() if packed else [None] * len(self.weights.layers)
            pending = None
            for li, (lw, pk) in enumerate(zip(self.weights.layers, packs)):
                x, pending = self._layer(f.scope(f"layer{li}."), li, lw, x, pending, positions, cos, sin, cu_seqlens,
                                         cache, step, plan, pk)
            return self._residual_norm(f, "final_norm", x, pending, self.weights.norm)[1]

    def _norm(self, f: OpTable, site: str, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return f(site, "rms_norm", x=x, weight=w, eps=self.config.rms_norm_eps, order=self.norm_order)

    def _residual_norm(self, f: OpTable, site: str, x: torch.Tensor, delta: torch.Tensor | None,
                       w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(x + delta, its norm)``: one ``add_rms_norm`` launch where the table has it (the
        residual add pending from the previous block), else the norm of ``x`` (``delta`` None)."""
        if delta is None:
            return x, self._norm(f, site, x, w)
        return f(site, "add_rms_norm", x=x, delta=delta, weight=w, eps=self.config.rms_norm_eps, order=self.norm_order)

    def _layer(self, f: OpTable, li: int, lw: Any, x: torch.Tensor, pending: torch.Tensor | None,
               positions: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cu_seqlens: torch.Tensor | None,
               cache: KVCache | None, step: _Step, plan: Any = None,
               packed: Any = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """One Qwen3DecoderLayer: ``x + attn(norm(x))``, then ``+ mlp(norm(.))``.

        Returns ``(x, pending)``. With a table that has ``add_rms_norm`` (:meth:`decode_ops`) each
        residual add runs inside the next norm's launch: the layer starts from ``x`` and the
        previous layer's MLP output ``pending``, and returns its own MLP output unadded. Other
        tables add at once (``pending`` None), with the same ops, order and sites as always."""
        cfg = self.config
        fused = f.has("add_rms_norm")
        t, h, hkv, d = x.shape[0], cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        x, xn = self._residual_norm(f, "input_layernorm", x, pending, lw.input_layernorm)
        if packed is not None:  # column slices of one product (views: unit stride on the last dim)
            qkv = f("qkv_proj", "det_gemm", a=xn, b=packed.qkv.t())
            q, k = qkv[:, : h * d], qkv[:, h * d : (h + hkv) * d]
            v = qkv[:, (h + hkv) * d :].reshape(t, hkv, d)
        else:
            q = f("q_proj", "det_gemm", a=xn, b=lw.q_proj.t())
            k = f("k_proj", "det_gemm", a=xn, b=lw.k_proj.t())
            v = f("v_proj", "det_gemm", a=xn, b=lw.v_proj.t()).reshape(t, hkv, d)
        if f.has("qk_norm_rope"):  # norms and rotations (decode: and the cache write) fused
            cached = {} if cache is None else dict(k_cache=cache.k[li], v_cache=cache.v[li], rows=step.rows,
                                                   positions=positions)
            q, k = f("qk_norm_rope", "qk_norm_rope", q=q.reshape(t, h, d), k=k.reshape(t, hkv, d), v=v,
                     q_weight=lw.q_norm, k_weight=lw.k_norm, eps=cfg.rms_norm_eps, order=self.norm_order, cos=cos,
                     sin=sin, **cached)
        else:
            q = f("q_norm", "qk_norm", x=q.reshape(t, h, d), weight=lw.q_norm, eps=cfg.rms_norm_eps,
                  order=self.norm_order)
            k = f("k_norm", "qk_norm", x=k.reshape(t, hkv, d), weight=lw.k_norm, eps=cfg.rms_norm_eps,
                  order=self.norm_order)
            q = f("q_rope", "rope", x=q, cos=cos, sin=sin)
            k = f("k_rope", "rope", x=k, cos=cos, sin=sin)
            if cache is not None:  # the one rounding of K/V happened in rope / v_proj; the cache stores those bits
                cache.k[li][step.rows, positions] = k
                cache.v[li][step.rows, positions] = v
        if step.cache_seqlens is not None:
            a = f("attention", "attention_decode", q=q, k_cache=cache.k[li], v_cache=cache.v[li],
                  cache_seqlens=step.cache_seqlens, scale=cfg.attention_scale)
        else:
            planned = {} if plan is None else {"plan": plan}
            a = f("attention", "attention", q=q, k=k, v=v, cu_seqlens_q=cu_seqlens, cu_seqlens_k=cu_seqlens,
                  scale=cfg.attention_scale, **planned)
        o = f("o_proj", "det_gemm", a=a.reshape(t, h * d), b=lw.o_proj.t())
        if fused:
            x, xn = self._residual_norm(f, "post_attention_layernorm", x, o, lw.post_attention_layernorm)
        else:
            x = f("attn_residual", "add", a=x, b=o)
            xn = self._norm(f, "post_attention_layernorm", x, lw.post_attention_layernorm)
        ffn = lw.gate_proj.shape[0]
        if f.has("gate_up_swiglu") and not torch.is_grad_enabled():
            # no backward will want gate / up: one launch (training_ops, Triton) writes only swiglu's output
            w_gate, w_up = ((lw.gate_proj, lw.up_proj) if packed is None
                            else (packed.gate_up[:ffn], packed.gate_up[ffn:]))
            m = f("gate_up_swiglu", "gate_up_swiglu", a=xn, w_gate=w_gate, w_up=w_up)
        elif packed is not None:
            gu = f("gate_up_proj", "det_gemm", a=xn, b=packed.gate_up.t())
            m = f("swiglu", "swiglu", gate=gu[:, :ffn], up=gu[:, ffn:])
        else:
            g = f("gate_proj", "det_gemm", a=xn, b=lw.gate_proj.t())
            u = f("up_proj", "det_gemm", a=xn, b=lw.up_proj.t())
            m = f("swiglu", "swiglu", gate=g, up=u)
        down = f("down_proj", "det_gemm", a=m, b=lw.down_proj.t())
        if fused:
            return x, down
        return f("mlp_residual", "add", a=x, b=down), None

    # -- the head ----------------------------------------------------------------------------------
    def logprobs(self, hidden: torch.Tensor, targets: torch.Tensor, *, head: str = "linear_logp",
                 temperature: float = 1.0) -> torch.Tensor:
        """FP32 logprobs [N] of ``targets`` [N] int64 given final hidden rows [N, E].

        ``head="linear_logp"``: fused ``linear_logp(hidden, lm_head, targets, temperature)``;
        ``head="lm_head_logp"``: ``logp(lm_head(hidden, W) [N, V] fp32, targets, temperature)``.
        Logits are FP32 in both (``docs/decisions.md`` 14).
        """
        f = self.ops
        if head == "linear_logp":
            out = f("logp", "linear_logp", hidden=hidden, weight=self.weights.lm_head, targets=targets,
                    temperature=temperature)
        elif head == "lm_head_logp":
            logits = f("lm_head", "lm_head", hidden=hidden, weight=self.weights.lm_head)
            out = f("logp", "logp", logits=logits, targets=targets, temperature=temperature)
        else:
            raise InputError(f"head must be one of {HEADS}, got {head!r}")
        if out.dtype != torch.float32:
            raise RLEngineError(f"{head} on {self.backend} returned {out.dtype}; logprobs must be float32")
        return out

    def logits(self, hidden: torch.Tensor, *, ops: OpTable | None = None) -> torch.Tensor:
        """FP32 logits [N, V] of final hidden rows [N, E] (``lm_head`` op; ``ops`` as in :meth:`forward`)."""
        return (ops or self.ops)("lm_head", "lm_head", hidden=hidden, weight=self.weights.lm_head)
