"""Whole-chain benchmarks of Qwen3-8B: one rollout decode step and a whole generation (issue #19);
teacher forcing and a train step (issue #33).

``chain_decode``: B sequences (the row's ``tokens``), each with ``context`` cached positions, take
one decode step: embedding, 36 decoder layers against the static KV cache, the final norm, the
FP32 ``lm_head`` and the engine's sampler (temperature 1, Gumbel-max) — what
:class:`rl_engine.rollout.engine.Engine` runs per step, without its slot bookkeeping. Weights are
seeded synthetic Qwen3-8B weights (:func:`rl_engine.chain.weights.synthetic_weights`), the cache
holds random values; every sequence sits at position ``context - 1``.

Variants: ``graph`` (the step captured once in a CUDA graph, the timed call is the replay) and
``eager`` (the same step from Python, op by op). Metric: GB/s of the bytes the step must read —
every weight once (the embedding table only for the B rows it gathers) and the whole KV cache —
so ``ratio`` against the copy bandwidth measured in the same run is the fraction of the
weight + KV-read bound and ``1 / ratio`` is the step time as a multiple of that bound (target
``chain.decode``: ratio >= 1 / 1.5). Hugging Face ``Qwen3ForCausalLM`` (sdpa, eager, on the same
weight tensors, a DynamicCache of the same length, cropped back after each step) is a second
baseline where ``transformers`` is installed and its cache fits (``B * context <= 131072``).

``chain_generate``: :func:`rl_engine.rollout.generate` of 64 prompts (128 random tokens each) x 512
new tokens in one static batch, timed once after one warm-up generation; GB/s of the bytes its decode
steps must read (:func:`generate_bytes`), so the ratio is again the fraction of the bound; the
row's note gives the token count for tokens/s.

``chain_teacher_forcing`` and ``chain_train_step`` (issue #33): B sequences of L random tokens
(``(B, L) = (8, 1024)`` and ``(2, 8192)``; ``--quick`` keeps ``(8, 1024)``), every row scored
against the next token of its sequence (the last row of a sequence against the sequence's first
token), all ``T = B * L`` rows. Ours: :class:`~rl_engine.chain.model.Qwen3Model` packed varlen
forward (``cu_seqlens``, positions restarting at 0) and the fused ``linear_logp`` head, FP32
logprobs ``[T]``. Baseline (where ``transformers`` is installed, on a GPU): Hugging Face
``Qwen3ForCausalLM`` (sdpa) on the same weight tensors, ``input_ids [B, L]``, BF16 logits of every
position, then ``log_softmax(logits.float()).gather(targets)`` — what RL trainers run today.
Teacher forcing runs under ``torch.no_grad()``; the train step adds ``loss = logprobs.sum()`` and
``loss.backward()`` into every weight (the weights are autograd leaves; their ``.grad`` is set to
None after each call). After one warm-up call, five calls are timed and their median is reported
(``measure="calls"``, :data:`~rl_engine.bench.timing.CALL_REPS`; p20 / p80 as the spread); metric
tokens/s = T / time (targets ``chain.teacher_forcing`` >= 1.1x and ``chain.train_step`` >= 1.0x
Hugging Face). The train step also has a ``memory`` row: peak memory
allocated above the start during one call, minus the gradients it returns (every weight's: the
same for both), in GiB (target ``chain.train_step_memory`` <= 0.7x Hugging Face's); the raw peak
stays in the row's ``memory`` field. A row that runs out of memory (expected of Hugging Face's train
step at 2 x 8192: by estimate its saved activations alone exceed 100 GB, beside 16 GB of weights
and 16 GB of gradients) is an error row; the run goes on, and each case's state (models,
gradients, graphs) is freed before the next (:mod:`rl_engine.bench.runner`).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from rl_engine.bench import counts
from rl_engine.bench.common import QWEN3_8B, Baseline, Case, Dims, leaf, no_grad
from rl_engine.bench.timing import CALL_REPS

OPS = ("chain_decode", "chain_generate", "chain_teacher_forcing", "chain_train_step")
BATCHES = (1, 16, 64)
CONTEXTS = (1024, 8192)
QUICK_CONTEXTS = (1024,)
TARGETED = ((1, 1024), (64, 1024), (16, 8192))
"""(B, context) of the graph rows that carry the ``chain.decode`` target (issue #19's targets)."""
HF_MAX_CACHED = 16 * 8192
"""Largest ``B * context`` with a Hugging Face row: its DynamicCache is a second copy of the cache."""

_WEIGHTS: dict[tuple[str, str], Any] = {}


DRY_RUN_CONFIG = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-6, rope_theta=1e6,
                      tie_word_embeddings=False, max_position_embeddings=256)
"""The ``--dry-run`` model: one layer, V = 512 (every op of the step runs once in the CPU interpreter)."""


def _config(d: Dims):
    from rl_engine.chain.config import Qwen3Config, get_config

    return get_config("qwen3-8b") if d.name == "qwen3-8b" else Qwen3Config(**DRY_RUN_CONFIG)


def _weights(d: Dims, device: torch.device):
    """Synthetic weights, generated once per process and device (8B: ~16 GB of the GPU)."""
    key = (d.name, str(device))
    if key not in _WEIGHTS:
        from rl_engine.chain.weights import synthetic_weights

        _WEIGHTS.clear()
        _WEIGHTS[key] = synthetic_weights(_config(d), 0, logit_scale=2.0, device=device)
    return _WEIGHTS[key]


def step_bytes(config, batch: int, context: int) -> int:
    """Bytes one decode step must read: every weight (BF16) once, B embedding rows instead of the
    table, and K and V of ``context`` positions in every layer."""
    from rl_engine.chain.weights import expected_shapes

    n = 0
    for name, shape in expected_shapes(config).items():
        numel = 1
        for s in shape:
            numel *= s
        n += batch * config.hidden_size if name == "model.embed_tokens.weight" else numel
    kv = 2 * config.num_hidden_layers * batch * context * config.num_key_value_heads * config.head_dim
    return 2 * (n + kv)


def step_flops(config, batch: int, context: int) -> int:
    """2 x (weights touched + attention's q.k and p.v) per sequence."""
    dense = step_bytes(config, 1, 0) // 2
    attn = 4 * config.num_hidden_layers * config.num_attention_heads * config.head_dim * context
    return 2 * batch * dense + batch * attn


def _build(s: dict[str, int], d: Dims, pool) -> dict[str, Any]:
    from rl_engine.chain.model import KVCache

    device = pool.device
    weights = _weights(d, device)
    cfg = weights.config
    b, ctx = s["B"], s["context"]
    g = torch.Generator(device=device).manual_seed(b * 100003 + ctx)
    cache = KVCache.allocate(cfg, b, ctx, torch.bfloat16, device, fill=0.0)
    for t in (*cache.k, *cache.v):
        t.normal_(generator=g)
    return {"weights": weights, "cache": cache, "B": b, "context": ctx,
            "ids": torch.randint(0, cfg.vocab_size, (b,), generator=g, device=device),
            "pos": torch.full((b,), ctx - 1, dtype=torch.int64, device=device),
            "seq": torch.arange(b, dtype=torch.int64, device=device)}


def decode_step_fn(model, st: dict[str, Any]):
    """The engine's step over fixed state: forward (decode, capture-safe ops), logits, sample."""
    from rl_engine.rollout.engine import fused_launches, packed_projections
    from rl_engine.rollout.sampling import Sampler, SamplingParams

    ops = model.decode_ops() if fused_launches(model.device) else model.capture_safe_ops()
    logp = ops.impl("logp")
    sampler, params = Sampler(), SamplingParams(temperature=1.0, seed=0)
    model.check_positions(0, st["context"] - 1, st["context"], "decode")  # the plan, once, on the host

    def step():
        hidden = model.forward(st["ids"], st["pos"], cache=st["cache"], decode=True, checked=True, ops=ops,
                               packed=packed_projections(model.device))
        return sampler.sample(logp, model.logits(hidden, ops=ops), st["seq"], st["seq"], st["pos"] + 1, params)

    return step


def _ours(variant: str):
    def make(backend: str, st: dict[str, Any]):
        from rl_engine.chain.model import Qwen3Model

        model = Qwen3Model(st["weights"], backend)
        step = decode_step_fn(model, st)
        if variant == "eager" or st["cache"].k[0].device.type != "cuda":
            return (lambda: _no_grad(step)), None if variant == "eager" else "no GPU: eager (dry run)"
        from rl_engine.graphs import capture

        graph, _ = capture(step)
        st.setdefault("graphs", []).append(graph)  # freed with the case's state
        return graph.replay, None

    return make


def _no_grad(fn):
    with torch.no_grad():
        return fn()


HF_LABEL = "Hugging Face Qwen3ForCausalLM (sdpa)"


def hf_causal_lm(weights, *, train: bool = False):
    """Hugging Face ``transformers.Qwen3ForCausalLM`` with sdpa attention over ``weights``' own
    tensors (built on the meta device, then ``load_state_dict(assign=True)``: every parameter is an
    ``nn.Parameter`` sharing the storage of the BF16 tensor of the same name, no copy; parameters
    require grad). The rotary table is rebuilt on the weights' device (the meta build has none).
    ``train``: ``model.train()`` (dropout is 0 in Qwen3, so only the mode flag differs), else eval."""
    import transformers

    cfg = transformers.Qwen3Config(**{k: v for k, v in weights.config.to_hf_dict().items()
                                      if k not in ("architectures", "model_type", "torch_dtype")})
    cfg._attn_implementation = "sdpa"
    with torch.device("meta"):
        model = transformers.Qwen3ForCausalLM(cfg)
    model.load_state_dict(weights.state_dict(), assign=True, strict=False)
    with torch.device(weights.device):  # transformers 5.17 took a device argument here, 5.24 does not
        model.model.rotary_emb = type(model.model.rotary_emb)(config=cfg)
    return model.train(train)


def _hf(st: dict[str, Any]):
    """Hugging Face Qwen3ForCausalLM (sdpa) decode step on the same weight tensors and a cache of the
    same length (random values); the cache is cropped back to ``context - 1`` after each step."""
    from transformers import DynamicCache

    weights = st["weights"]
    model = hf_causal_lm(weights)
    cfg = model.config
    b, ctx = st["B"], st["context"]
    cache = DynamicCache(config=cfg)
    for li in range(cfg.num_hidden_layers):  # HF layout [B, Hkv, L, D]
        cache.update(st["cache"].k[li][:, : ctx - 1].transpose(1, 2).contiguous(),
                     st["cache"].v[li][:, : ctx - 1].transpose(1, 2).contiguous(), li)
    ids = st["ids"][:, None]
    pos = st["pos"][:, None]

    def step():
        with torch.no_grad():
            out = model(input_ids=ids, position_ids=pos, past_key_values=cache, use_cache=True)
            cache.crop(-1)  # drop the step's token (5.24 refuses the old absolute length)
            return out.logits

    st["hf_model"] = model
    return step, "transformers.Qwen3ForCausalLM, sdpa attention, eager (no graph), DynamicCache cropped per step"


def _case(batch: int, context: int, variant: str) -> Case:
    def sizes(d: Dims, t: int) -> dict[str, int]:
        c = _config(d)
        ctx = context if d.name == "qwen3-8b" else min(context, d.decode_context)
        return {"B": t, "context": ctx, "layers": c.num_hidden_layers, "E": c.hidden_size, "V": c.vocab_size}

    def count(s):
        from rl_engine.bench.common import QWEN3_8B, TINY

        c = _config(QWEN3_8B if s["E"] == QWEN3_8B.hidden else TINY)
        return step_flops(c, s["B"], s["context"]), step_bytes(c, s["B"], s["context"])

    target = "chain.decode" if variant == "graph" and (batch, context) in TARGETED else None
    baselines = [Baseline("copy bandwidth (weight + KV-read bound)", peak="copy", target=target, primary=True)]
    if variant == "graph" and batch * context <= HF_MAX_CACHED:
        baselines.append(Baseline(HF_LABEL, make=_hf, requires="transformers",
                                  needs_cuda=True))
    return Case(op="chain_decode", family="chain", kernel_op="chain", variant=variant, tokens=batch,
                metric="GB/s", sizes=sizes, label=lambda s: f"B{s['B']}-ctx{s['context']}-L{s['layers']}",
                count=count, build=_build, ours=_ours(variant), baselines=baselines)


GENERATE = {"prompts": 64, "prompt_len": 128, "new_tokens": 512}
"""``chain_generate``: 64 prompts of 128 tokens, 512 new tokens each (issue #19's generation row)."""
DRY_GENERATE = {"prompts": 2, "prompt_len": 3, "new_tokens": 2}


def generate_bytes(config, prompts: int, prompt_len: int, new_tokens: int) -> int:
    """Bytes the decode steps of a static batch must read: step ``i`` (1 .. C-1) feeds every sequence
    at position ``P + i - 1`` over a cache of ``P + i`` positions (the prefills are not counted)."""
    return sum(step_bytes(config, prompts, prompt_len + i) for i in range(1, new_tokens))


def _generate_case() -> Case:
    def sizes(d: Dims, t: int) -> dict[str, int]:
        g = GENERATE if d.name == "qwen3-8b" else DRY_GENERATE
        return {"B": g["prompts"], "P": g["prompt_len"], "C": g["new_tokens"], "layers": _config(d).num_hidden_layers}

    def count(s):
        from rl_engine.bench.common import QWEN3_8B, TINY

        c = _config(QWEN3_8B if s["layers"] == 36 else TINY)
        return 0, generate_bytes(c, s["B"], s["P"], s["C"])

    def build(s, d, pool):
        weights = _weights(d, pool.device)
        g = torch.Generator().manual_seed(11)
        prompts = torch.randint(0, weights.config.vocab_size, (s["B"], s["P"]), generator=g).tolist()
        return {"weights": weights, "prompts": prompts, "new_tokens": s["C"]}

    def ours(backend, st):
        from rl_engine.chain.model import Qwen3Model
        from rl_engine.rollout import generate

        model = Qwen3Model(st["weights"], backend)
        n = len(st["prompts"])

        def run():
            res = generate(model, st["prompts"], st["new_tokens"], temperature=1.0, seed=0, max_batch=n)
            return [c.tokens for c in res.completions]

        note = (f"{n} prompts x {len(st['prompts'][0])} tokens, {st['new_tokens']} new tokens each, one static "
                f"batch, temperature 1; the time includes the per-prompt prefills and the graph capture; "
                f"tokens/s = {n * st['new_tokens']} / time")
        return run, note

    return Case(op="chain_generate", family="chain", kernel_op="chain", variant="graph", tokens=GENERATE["prompts"],
                metric="GB/s", sizes=sizes, label=lambda s: f"B{s['B']}-P{s['P']}-C{s['C']}-L{s['layers']}",
                count=count, build=build, ours=ours, measure="once",
                baselines=[Baseline("copy bandwidth (decode steps' weight + KV-read bound)", peak="copy", primary=True)])


# -- teacher forcing and the train step (issue #33) ----------------------------------------------
TF_SHAPES = ((8, 1024), (2, 8192))
"""(B, L) of ``chain_teacher_forcing`` and ``chain_train_step``: many short sequences, few long ones."""
QUICK_TF_SHAPES = ((8, 1024),)
DRY_TF = (2, 3)
"""(B, L) of every teacher-forcing and train-step case in ``--dry-run`` (the tiny model)."""
TF_TARGETS = {("chain_teacher_forcing", "time"): "chain.teacher_forcing",
              ("chain_train_step", "time"): "chain.train_step",
              ("chain_train_step", "memory"): "chain.train_step_memory"}
"""The target of each (item, variant): every row against Hugging Face (:mod:`rl_engine.bench.targets`)."""


def matmul_params(config) -> int:
    """Weights one token multiplies through (the projections of every layer and ``lm_head``; the
    embedding is a gather and the norms are elementwise, neither counted)."""
    e, f = config.hidden_size, config.intermediate_size
    q, kv = config.num_attention_heads * config.head_dim, config.num_key_value_heads * config.head_dim
    return config.num_hidden_layers * (2 * e * q + 2 * e * kv + 3 * e * f) + config.vocab_size * e


def teacher_forcing_flops(config, batch: int, length: int, *, backward: bool = False) -> int:
    """Matrix-product FLOPs of ``batch`` causal sequences of ``length`` tokens through the whole
    model and the logprob head: forward ``2 * T * matmul_params`` plus attention's
    (:func:`~rl_engine.bench.counts.attention_flops` over every layer's causal pairs); ``backward``
    (the train step): the weight products x3 (forward, data and weight gradients) and attention's
    forward + backward (14 * D per pair)."""
    t = batch * length
    pairs = config.num_hidden_layers * batch * counts.causal_pairs(length, length)
    dense = 2 * t * matmul_params(config)
    attn = counts.attention_flops(pairs, config.num_attention_heads, config.head_dim, backward=backward)
    return (3 * dense if backward else dense) + attn


def teacher_forcing_bytes(config, batch: int, length: int, *, backward: bool = False) -> int:
    """Weight traffic, the least either implementation moves (activations are not counted): forward
    reads every weight once (BF16; of the embedding only the T rows it gathers), the ids and targets
    (int64) and writes the FP32 logprobs ``[T]``; ``backward`` adds a second read of every weight
    but the embedding (the data gradients) and a write of every gradient (BF16, the embedding's
    ``[V, E]`` in full)."""
    from rl_engine.chain.weights import expected_shapes

    t = batch * length
    total = sum(math.prod(shape) for shape in expected_shapes(config).values())
    embed = config.vocab_size * config.hidden_size
    fwd = counts.BF16 * (total - embed + t * config.hidden_size) + 2 * counts.INT64 * t + counts.FP32 * t
    if not backward:
        return fwd
    return fwd + counts.BF16 * (total - embed) + counts.BF16 * total


def _tf_build(s: dict[str, int], d: Dims, pool) -> dict[str, Any]:
    """Random ids ``[B, L]`` int64 and their targets (the next token of each sequence; the last
    row: the sequence's first token), the packed forms (``[T]``, positions restarting at 0,
    ``cu_seqlens`` int32 ``[B + 1]``) and the cached synthetic weights."""
    device = pool.device
    weights = _weights(d, device)
    b, n = s["B"], s["seq"]
    g = torch.Generator(device=device).manual_seed(b * 1009 + n)
    ids = torch.randint(0, weights.config.vocab_size, (b, n), generator=g, device=device)
    targets = torch.roll(ids, -1, dims=1)
    return {"weights": weights, "B": b, "seq": n, "ids": ids, "targets": targets,
            "flat_ids": ids.reshape(-1), "flat_targets": targets.reshape(-1),
            "positions": torch.arange(n, dtype=torch.int64, device=device).repeat(b),
            "cu_seqlens": torch.arange(0, b * n + 1, n, dtype=torch.int32, device=device)}


def teacher_forcing_fn(model, st: dict[str, Any], ops: Any = None):
    """``() -> FP32 logprobs [T]``: ``model.forward`` (packed varlen over ``st``'s B sequences,
    positions validated once here; ``ops`` the op table, default the model's) and
    ``model.logprobs`` (the fused ``linear_logp`` head) of every row's target. Records autograd
    when the caller does (the weights are leaves)."""
    model.check_positions(0, st["seq"] - 1)

    def run():
        hidden = model.forward(st["flat_ids"], st["positions"], cu_seqlens=st["cu_seqlens"], checked=True, ops=ops)
        return model.logprobs(hidden, st["flat_targets"])

    return run


def hf_teacher_forcing_fn(model, st: dict[str, Any]):
    """``() -> FP32 logprobs [B, L]`` from Hugging Face: ``model(input_ids [B, L], use_cache=False)``
    (BF16 logits ``[B, L, V]``), ``log_softmax(logits.float(), -1)`` gathered at the targets."""
    ids, targets = st["ids"], st["targets"]

    def run():
        logits = model(input_ids=ids, use_cache=False).logits
        return torch.log_softmax(logits.float(), -1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)

    return run


def train_step_fn(forward, params: list[torch.Tensor]):
    """``() -> gradients``: ``loss = forward().sum()``, ``loss.backward()``, then every parameter's
    ``.grad`` is returned (one BF16 tensor per weight, in ``params`` order) and set back to None,
    so calls do not accumulate and nothing outlives the call but what it returns. Raises
    RuntimeError when a parameter got no gradient."""

    def run():
        try:
            forward().sum().backward()
            grads = tuple(p.grad for p in params)
        finally:
            for p in params:
                p.grad = None
        if any(g is None for g in grads):
            raise RuntimeError(f"the train step left {sum(g is None for g in grads)} of {len(params)} weights without "
                               f"a gradient")
        return grads

    return run


def _tf_note(st: dict[str, Any], who: str, train: bool) -> str:
    b, n = st["B"], st["seq"]
    what = ("forward + FP32 logprobs, loss = their sum, backward into every weight (.grad cleared after each call)"
            if train else "forward + FP32 logprobs under no_grad")
    return (f"{who}: {b} x {n} tokens, all {b * n} rows scored; {what}; median of {CALL_REPS} calls after one "
            "warm-up call")


def _tf_ours(train: bool):
    def make(backend: str, st: dict[str, Any]):
        from rl_engine.chain.model import Qwen3Model
        from rl_engine.chain.weights import weights_from_named

        weights = st["weights"]
        how = ("packed varlen, Qwen3Model.training_ops (residual adds and QK-norm + RoPE fused into the RMSNorm "
               "kernels), linear_logp head")
        if not train:
            model = Qwen3Model(weights, backend)
            return no_grad(teacher_forcing_fn(model, st, model.training_ops())), _tf_note(st, how, False)
        leaves = {name: leaf(t) for name, t in weights.named_tensors()}  # share the storage, no copy
        model = Qwen3Model(weights_from_named(weights.config, leaves, weights.provenance), backend)
        step = train_step_fn(teacher_forcing_fn(model, st, model.training_ops()), list(leaves.values()))
        return step, _tf_note(st, how, True)

    return make


def _tf_hf(train: bool):
    def make(st: dict[str, Any]):
        model = hf_causal_lm(st["weights"], train=train)
        fwd = hf_teacher_forcing_fn(model, st)
        note = _tf_note(st, "input_ids [B, L], sdpa, BF16 logits, log_softmax(logits.float()).gather", train)
        if not train:
            return no_grad(fwd), note
        return train_step_fn(fwd, list(model.parameters())), note

    return make


def _tf_case(op: str, batch: int, length: int, variant: str) -> Case:
    train = op == "chain_train_step"
    measure = "memory" if variant == "memory" else "calls"

    def sizes(d: Dims, t: int) -> dict[str, int]:
        b, n = (batch, length) if d.name == "qwen3-8b" else DRY_TF
        c = _config(d)
        return {"B": b, "seq": n, "T": b * n, "layers": c.num_hidden_layers, "E": c.hidden_size, "V": c.vocab_size}

    def count(s):
        from rl_engine.bench.common import TINY

        c = _config(QWEN3_8B if s["E"] == QWEN3_8B.hidden else TINY)
        return (teacher_forcing_flops(c, s["B"], s["seq"], backward=train),
                teacher_forcing_bytes(c, s["B"], s["seq"], backward=train))

    return Case(op=op, family="chain", kernel_op="chain", variant=variant, tokens=batch * length,
                metric="GiB" if measure == "memory" else "tokens/s", measure=measure, sizes=sizes,
                label=lambda s: f"B{s['B']}-seq{s['seq']}-L{s['layers']}", count=count, build=_tf_build,
                ours=_tf_ours(train),
                baselines=[Baseline(HF_LABEL, make=_tf_hf(train), requires="transformers", needs_cuda=True,
                                    target=TF_TARGETS[(op, variant)], primary=True)])


def cases(op: str, tokens: list[int], quick: bool) -> list[Case]:
    """The cases of bench item ``op`` (``tokens`` is not used: each item has its own shapes)."""
    if op == "chain_generate":
        return [_generate_case()]
    if op in ("chain_teacher_forcing", "chain_train_step"):
        variants = ("time", "memory") if op == "chain_train_step" else ("time",)
        return [_tf_case(op, b, n, v) for b, n in (QUICK_TF_SHAPES if quick else TF_SHAPES) for v in variants]
    if op != "chain_decode":
        raise KeyError(op)
    contexts = QUICK_CONTEXTS if quick else CONTEXTS
    return [_case(b, c, v) for c in contexts for b in BATCHES for v in ("graph", "eager")]
