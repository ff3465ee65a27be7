"""``rl_engine.integrations.transformers.apply``: a Hugging Face Qwen3ForCausalLM on the project's kernels.

What is checked, on a tiny Qwen3 (V 256, E 64, 2 layers, 4 / 2 heads, D 16, F 128) whose every
weight is redrawn from the chain's seeded recipe (norm weights around 1, never exactly 1, so a
dropped weight shows):

1. the patched model's teacher-forcing logprobs are the chain's bits (``score_teacher_forcing`` on
   ``Qwen3Model(qwen3_weights(model))``) for an unpadded batch, a packed row (``position_ids``
   resets) and a right-padded batch, both heads; controls: the unpatched BF16 model, and the
   patched model with one op (layer 0's SwiGLU) left to Hugging Face, are not;
2. the gradients of sum(logprobs) w.r.t. every parameter are the chain's bits (same ops, same
   packed layout); control: one op left to Hugging Face moves them;
3. ``undo`` restores the model: the same output bits as before ``apply``, no replaced forward left;
4. every bad input is refused with InputError / ConfigError / RLEngineError before any op runs
   (apply-time: the model is left as it was; call-time: a spy op table records no call; control:
   the spy sees the calls of a good input);
5. a Hugging Face style training step (``-mean logprob``, backward, SGD; and the ``labels`` loss)
   runs, and the updated model is still the chain's bits on the updated (shared) weights;
plus the rollout engine's sampled logprobs and a KV-cache continuation.

Every backend test is parametrised over the kernel backends; one that cannot run here is
skipped with :func:`rl_engine.backends.registry.availability`'s reason. The Triton backend runs in
the CPU interpreter when there is no GPU (``tests/conftest.py``), so sequences are short.
"""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip(
    "transformers", reason="transformers is not installed here (it is a test extra: pip install -e '.[test]')")

from rl_engine.backends.registry import KERNEL_BACKENDS, availability  # noqa: E402
from rl_engine.chain.config import ConfigError, Qwen3Config  # noqa: E402
from rl_engine.chain.model import Qwen3Model  # noqa: E402
from rl_engine.chain.scoring import SeqBatch, score_teacher_forcing  # noqa: E402
from rl_engine.chain.weights import synthetic_weights  # noqa: E402
from rl_engine.errors import BackendUnavailable, InputError, RLEngineError  # noqa: E402
from rl_engine.integrations import transformers as hfk  # noqa: E402

TINY = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-6, rope_theta=1e6, tie_word_embeddings=False,
            max_position_embeddings=64)
BACKENDS = [pytest.param(b, id=b) for b in KERNEL_BACKENDS]
LENGTHS = (8, 5)


def _needs(backend: str) -> None:
    ok, why = availability(backend)
    if not ok:
        pytest.skip(f"{backend} cannot run here: {why}")


def _bits(x: torch.Tensor) -> torch.Tensor:
    return x.detach().contiguous().view(torch.int32 if x.dtype == torch.float32 else torch.int16)


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(_bits(a), _bits(b))


def _mismatch(a: torch.Tensor, b: torch.Tensor) -> str:
    """Count, worst index and both values of a bitwise mismatch (for assertion messages)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return f"{list(a.shape)} {a.dtype} vs {list(b.shape)} {b.dtype}"
    diff = _bits(a) != _bits(b)
    err = (a.double() - b.double()).abs().nan_to_num(nan=float("inf"))
    i = int(err.reshape(-1).argmax())
    return f"{int(diff.sum())} / {diff.numel()} differ; worst at flat {i}: {a.reshape(-1)[i]} vs {b.reshape(-1)[i]}"


@pytest.fixture(scope="module")
def weights(device):
    return synthetic_weights(Qwen3Config(**TINY), 0, logit_scale=2.0, device=device)


@pytest.fixture(scope="module")
def seqs(device):
    gen = torch.Generator().manual_seed(35)
    return tuple(torch.randint(0, TINY["vocab_size"], (n,), generator=gen).to(device) for n in LENGTHS)


def hf_model(weights=None, device="cpu", **overrides):
    """A fresh transformers Qwen3ForCausalLM in BF16 (eval mode, sdpa attention), its parameters
    overwritten with ``weights`` (the chain's synthetic values) when given."""
    hf_cfg = {k: v for k, v in Qwen3Config(**TINY).to_hf_dict().items()
              if k not in ("architectures", "model_type", "torch_dtype")}
    m = transformers.Qwen3ForCausalLM(transformers.Qwen3Config(**{**hf_cfg, **overrides}))
    m = m.to(device=device, dtype=torch.bfloat16).eval()
    if weights is not None:
        m.load_state_dict(weights.state_dict(), strict=True)
    return m


def layout(name: str, seqs: tuple[torch.Tensor, ...], device) -> tuple[dict, tuple[torch.Tensor, ...]]:
    """HF inputs of one layout and the sequences they hold (what the chain scores).

    ``rows``: [2, 8], two unpadded rows; ``packed``: [1, 13], both sequences in one row with
    position_ids restarting at 0; ``padded``: [2, 8], the second row right-padded from 5 tokens."""
    a, b = seqs
    if name == "rows":
        b8 = torch.cat([b, a[:3]])
        return {"input_ids": torch.stack([a, b8])}, (a, b8)
    if name == "packed":
        pos = torch.cat([torch.arange(a.numel()), torch.arange(b.numel())]).to(device)
        return {"input_ids": torch.cat([a, b])[None], "position_ids": pos[None]}, (a, b)
    if name == "padded":
        pad = torch.full((a.numel() - b.numel(),), 7, dtype=torch.int64, device=device)
        mask = torch.tensor([[1] * a.numel(), [1] * b.numel() + [0] * pad.numel()], device=device)
        return {"input_ids": torch.stack([a, torch.cat([b, pad])]), "attention_mask": mask}, (a, b)
    raise AssertionError(name)


def chain_logprobs(model, held: tuple[torch.Tensor, ...], backend: str, head: str) -> torch.Tensor:
    """The chain's teacher-forcing logprobs [N] of every token after the first of each sequence,
    on the weights converted from ``model`` (shared storage)."""
    chain = Qwen3Model(hfk.qwen3_weights(model), backend)
    return score_teacher_forcing(chain, SeqBatch(tuple(held), (1,) * len(held)), head=head)


def chain_grads(model, held: tuple[torch.Tensor, ...], backend: str, head: str) -> dict[str, torch.Tensor]:
    """d sum(logprobs) / d parameter by the chain's own composition (``score_teacher_forcing``'s
    forward, row selection and head, with autograd on), accumulated into ``model``'s parameters."""
    chain = Qwen3Model(hfk.qwen3_weights(model, detach=False), backend)
    dev = chain.device
    lens = [int(s.numel()) for s in held]
    ids = torch.cat(held)
    positions = torch.cat([torch.arange(n, dtype=torch.int64) for n in lens]).to(dev)
    cu = torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int32, device=dev)
    rows = torch.cat([torch.arange(int(c) , int(c) + n - 1) for c, n in zip(cu[:-1].tolist(), lens)]).to(dev)
    model.zero_grad(set_to_none=True)
    hidden = chain.forward(ids, positions, cu_seqlens=cu)
    chain.logprobs(hidden.index_select(0, rows), ids.index_select(0, rows + 1), head=head).sum().backward()
    out = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    return out


def untouched(model) -> bool:
    """No forward replaced, the original attention implementation, no patch recorded."""
    replaced = [n for n, mod in model.named_modules() if "forward" in mod.__dict__]
    return not replaced and model.config._attn_implementation == "sdpa" and hfk.patch_of(model) is None


class Spy:
    """An op table that records every call, then runs the real op."""

    def __init__(self, inner):
        self.inner, self.calls = inner, []

    def __call__(self, site, op, **kwargs):
        self.calls.append(site)
        return self.inner(site, op, **kwargs)


# -- weights ---------------------------------------------------------------------------------------
def test_weights_share_storage_and_values(weights, device):
    m = hf_model(weights, device)
    w = hfk.qwen3_weights(m)
    assert w.config == weights.config
    for (name, ours), (name_syn, syn) in zip(w.named_tensors(), weights.named_tensors()):
        assert name == name_syn and _same_bits(ours, syn), name
        assert ours.data_ptr() == m.get_parameter(name).data_ptr() and not ours.requires_grad, name
    live = hfk.qwen3_weights(m, detach=False)
    assert live.layers[1].down_proj is m.model.layers[1].mlp.down_proj.weight
    tied = hf_model(None, device, tie_word_embeddings=True)
    wt = hfk.qwen3_weights(tied)
    assert wt.lm_head is wt.embed_tokens and wt.embed_tokens.data_ptr() == tied.lm_head.weight.data_ptr()


def test_padding_idx_row_gets_no_gradient(weights, device):
    """nn.Embedding's rule survives the patch: the padding row's gradient is zero, every other
    row's is the embedding op's own (the chain's), and the values are the op's."""
    from rl_engine.ops.embedding import embedding

    _needs("triton_cuda_bf16")
    m = hf_model(weights, device, pad_token_id=7)
    ids = torch.tensor([[3, 7, 9, 7, 3]], device=device)
    with hfk.apply(m):
        out = m.model.embed_tokens(ids)
        out.float().square().sum().backward()
    w = m.model.embed_tokens.weight.detach().clone().requires_grad_()
    want = embedding(ids.reshape(-1), w)
    want.float().square().sum().backward()
    assert _same_bits(out.reshape(want.shape), want)
    got = m.model.embed_tokens.weight.grad
    assert not bool(got[7].any()) and bool(w.grad[7].any())
    rows = torch.tensor([r for r in range(TINY["vocab_size"]) if r != 7], device=device)
    assert _same_bits(got.index_select(0, rows), w.grad.index_select(0, rows))


# -- 1. logprobs: the chain's bits ----------------------------------------------------------------
@pytest.mark.parametrize("head", ["lm_head_logp", "linear_logp"])
@pytest.mark.parametrize("name", ["rows", "packed", "padded"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_logprobs_equal_the_chain_bitwise(backend, name, head, weights, seqs, device):
    _needs(backend)
    m = hf_model(weights, device)
    inputs, held = layout(name, seqs, device)
    ref = chain_logprobs(m, held, backend, head)
    with hfk.apply(m, backend):
        with torch.no_grad():
            got = hfk.logprobs(m, **inputs, head=head)
            logits = m(**inputs).logits if name == "rows" else None
    assert got.logprobs.dtype == torch.float32 and got.mask.shape == got.logprobs.shape
    assert int(got.mask.sum()) == ref.numel()
    assert _same_bits(got.logprobs[got.mask], ref), _mismatch(got.logprobs[got.mask], ref)
    assert not bool(got.logprobs[~got.mask].any())
    if logits is not None:  # the patched lm_head: FP32 logits, the chain's bits
        chain = Qwen3Model(hfk.qwen3_weights(m), backend)
        ids = inputs["input_ids"]
        cu = torch.tensor([0, ids.shape[1], ids.numel()], dtype=torch.int32, device=device)
        pos = torch.arange(ids.shape[1], device=device).repeat(ids.shape[0])
        with torch.no_grad():
            want = chain.logits(chain.forward(ids.reshape(-1), pos, cu_seqlens=cu))
        assert _same_bits(logits.reshape(want.shape), want), _mismatch(logits.reshape(want.shape), want)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_bare_qwen3model_gives_the_chains_hidden_states(backend, weights, seqs, device):
    """apply() on a transformers Qwen3Model (no head): its last_hidden_state [B, S, E] bf16 is
    the chain forward's final-norm output, bit for bit."""
    _needs(backend)
    outer = hf_model(weights, device)
    base = outer.model
    ids = layout("rows", seqs, device)[0]["input_ids"]
    chain = Qwen3Model(hfk.qwen3_weights(outer), backend)
    cu = torch.tensor([0, ids.shape[1], ids.numel()], dtype=torch.int32, device=device)
    pos = torch.arange(ids.shape[1], device=device).repeat(ids.shape[0])
    with torch.no_grad():
        want = chain.forward(ids.reshape(-1), pos, cu_seqlens=cu)
        with hfk.apply(base, backend):
            got = base(input_ids=ids).last_hidden_state
            with pytest.raises(InputError, match="expected a Qwen3ForCausalLM patched"):
                hfk.logprobs(base, ids)
    assert _same_bits(got.reshape(want.shape), want), _mismatch(got.reshape(want.shape), want)
    assert untouched(outer)


@pytest.mark.parametrize("backend", BACKENDS)
def test_negative_controls_are_not_the_chains_bits(backend, weights, seqs, device):
    """The comparison above can fail: the unpatched BF16 model, and the patched model with layer
    0's SwiGLU handed back to Hugging Face (``act_fn(gate) * up`` in BF16), give other bits."""
    _needs(backend)
    m = hf_model(weights, device)
    inputs, held = layout("rows", seqs, device)
    ref = chain_logprobs(m, held, backend, "lm_head_logp")
    ids = inputs["input_ids"]
    with torch.no_grad():
        logits = m(**inputs).logits.float()
    plain = torch.log_softmax(logits[:, :-1], -1).gather(-1, ids[:, 1:, None])[..., 0].reshape(-1)
    assert not _same_bits(plain, ref)
    with hfk.apply(m, backend):
        del m.model.layers[0].mlp.__dict__["forward"]  # one op left unpatched
        with torch.no_grad():
            got = hfk.logprobs(m, **inputs)
    assert not _same_bits(got.logprobs[got.mask], ref)
    assert untouched(m)


# -- 2. gradients -------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["rows", "packed"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_gradients_equal_the_chain_bitwise(backend, name, weights, seqs, device):
    """Same ops, same order, same packed layout (T tokens): every parameter's gradient is the
    chain's bits. (A right-padded batch has more tokens than the chain's packing; a weight
    gradient reduces over the token axis, so it is not compared there: docs/integrations.md.)"""
    _needs(backend)
    m = hf_model(weights, device)
    inputs, held = layout(name, seqs, device)
    want = chain_grads(m, held, backend, "lm_head_logp")
    with hfk.apply(m, backend):
        hfk.logprobs(m, **inputs).logprobs.sum().backward()
        got = {n: p.grad for n, p in m.named_parameters()}
        bad = [f"{n}: {_mismatch(got[n], want[n])}" for n in want if not _same_bits(got[n], want[n])]
        assert not bad, "\n".join(bad)
        if name == "rows":  # control: one op left to Hugging Face moves the gradients
            m.zero_grad(set_to_none=True)
            del m.model.layers[0].mlp.__dict__["forward"]
            hfk.logprobs(m, **inputs).logprobs.sum().backward()
            assert any(not _same_bits(p.grad, want[n]) for n, p in m.named_parameters())


# -- 3. undo ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("backend", BACKENDS)
def test_undo_restores_the_model_bitwise(backend, weights, seqs, device):
    _needs(backend)
    m = hf_model(weights, device)
    inputs, _ = layout("rows", seqs, device)
    with torch.no_grad():
        before = m(**inputs).logits
    assert untouched(m)
    h = hfk.apply(m, backend)
    assert hfk.patch_of(m) is h and hfk.patch_of(m.model) is h and m.config._attn_implementation == "rl_engine"
    with torch.no_grad():
        patched = m(**inputs).logits
    assert patched.dtype == torch.float32 and not _same_bits(patched, before.float())
    h.undo()
    h.undo()  # idempotent
    assert untouched(m)
    with torch.no_grad():
        after = m(**inputs).logits
    assert _same_bits(after, before), _mismatch(after, before)
    hfk.apply(m, backend)  # applies again after an undo; the module-level undo finds it
    hfk.undo(m)
    assert untouched(m)
    with pytest.raises(InputError, match="not patched"):
        hfk.undo(m)


# -- 4. bad input ------------------------------------------------------------------------------------
def _not_qwen3(weights, device):
    cfg = transformers.LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                                   num_attention_heads=4, num_key_value_heads=2, head_dim=16)
    return transformers.LlamaForCausalLM(cfg).to(torch.bfloat16)


def _lora_like(weights, device):
    m = hf_model(weights, device)
    old = m.model.layers[1].self_attn.v_proj

    class LoraLinear(torch.nn.Linear):
        pass

    new = LoraLinear(old.in_features, old.out_features, bias=False).to(device=device, dtype=torch.bfloat16)
    m.model.layers[1].self_attn.v_proj = new
    return m


def _hooked(weights, device):
    m = hf_model(weights, device)
    m.model.norm.forward = lambda x: x  # someone else's patch
    return m


APPLY_REFUSALS = {
    "not-a-qwen3": (_not_qwen3, "triton_cuda_bf16", InputError, "expected a transformers Qwen3ForCausalLM"),
    "float32": (lambda w, d: hf_model(w, d).float(), "triton_cuda_bf16", InputError, "dtype float32"),
    "unknown-backend": (hf_model, "triton", RLEngineError, "backend must be one of"),
    "comparison-backend": (hf_model, "torch_bf16", RLEngineError, "backend must be one of"),
    "attention-bias": (lambda w, d: hf_model(None, d, attention_bias=True), "triton_cuda_bf16", ConfigError,
                       "attention_bias"),
    "sliding-window": (lambda w, d: hf_model(None, d, use_sliding_window=True, sliding_window=4, max_window_layers=1),
                       "triton_cuda_bf16", ConfigError, "sliding_window"),
    "rope-scaling": (lambda w, d: hf_model(None, d, rope_parameters={"rope_type": "linear", "factor": 2.0,
                                                                     "rope_theta": 1e6}),
                     "triton_cuda_bf16", ConfigError, "rope_type 'linear'"),
    "attention-dropout": (lambda w, d: hf_model(None, d, attention_dropout=0.1), "triton_cuda_bf16", ConfigError,
                          "attention_dropout"),
    "lora-layer": (_lora_like, "triton_cuda_bf16", InputError, "v_proj: expected Linear"),
    "forward-replaced": (_hooked, "triton_cuda_bf16", InputError, "already replaced"),
}


@pytest.mark.parametrize("case", list(APPLY_REFUSALS))
def test_apply_refuses_and_leaves_the_model_as_it_was(case, weights, device):
    make, backend, exc, match = APPLY_REFUSALS[case]
    _needs("triton_cuda_bf16")
    m = make(weights, device)
    planted = {n for n, mod in m.named_modules() if "forward" in mod.__dict__}
    impl = m.config._attn_implementation
    with pytest.raises(exc, match=match):
        hfk.apply(m, backend)
    assert {n for n, mod in m.named_modules() if "forward" in mod.__dict__} == planted
    assert m.config._attn_implementation == impl and hfk.patch_of(m) is None


def test_apply_twice_is_refused(weights, device):
    _needs("triton_cuda_bf16")
    m = hf_model(weights, device)
    with hfk.apply(m):
        for target in (m, m.model):
            with pytest.raises(InputError, match="already patched"):
                hfk.apply(target)
    assert untouched(m)


def test_an_unavailable_backend_is_refused_with_its_reason(weights, device):
    down = [b for b in KERNEL_BACKENDS if not availability(b)[0]]
    if not down:
        pytest.skip("every kernel backend can run here")
    m = hf_model(weights, device)
    with pytest.raises(BackendUnavailable, match="cannot run here") as info:
        hfk.apply(m, down[0])
    assert availability(down[0])[1] in str(info.value)
    assert untouched(m)


def _cache_name(m) -> str:
    """transformers' name for the KV cache argument and output field (``past_key_values`` up to 5.1x,
    ``cache`` since)."""
    import inspect

    return "cache" if "cache" in inspect.signature(type(m).forward).parameters else "past_key_values"


def _cache_kw(m, out) -> dict:
    return {_cache_name(m): getattr(out, _cache_name(m))}


def _static_cache(m):
    return {_cache_name(m): transformers.StaticCache(config=m.config, max_cache_len=16), "use_cache": True}


S = LENGTHS[0]
CALL_REFUSALS = {
    "left-padding": (lambda m, d: {"attention_mask": torch.tensor([[1] * S, [0] + [1] * (S - 1)], device=d)},
                     "left padding"),
    "mask-hole": (lambda m, d: {"attention_mask": torch.tensor([[1] * S, [1, 0] + [1] * (S - 2)], device=d)},
                  "a 0 before a 1"),
    "mask-4d": (lambda m, d: {"attention_mask": torch.ones(2, 1, S, S, device=d)}, "2-D"),
    "mask-values": (lambda m, d: {"attention_mask": torch.full((2, S), 2, device=d)}, "0 or 1"),
    "positions-not-from-0": (lambda m, d: {"position_ids": torch.arange(1, S + 1, device=d)[None]}, "starts at 1"),
    "positions-jump": (lambda m, d: {"position_ids": torch.tensor([[0, 1, 2, 5, 6, 7, 8, 9]], device=d)},
                       "2 then 5"),
    "positions-past-table": (lambda m, d: {"position_ids": torch.arange(S, device=d)[None] + 60},
                             "max_position_embeddings"),
    "ids-int32": (lambda m, d: {"input_ids": torch.zeros(2, S, dtype=torch.int32, device=d)}, "int64"),
    "ids-out-of-range": (lambda m, d: {"input_ids": torch.full((2, S), 256, device=d)}, "vocab_size"),
    "embeds-float32": (lambda m, d: {"input_ids": None, "inputs_embeds": torch.zeros(2, S, 64, device=d)},
                       "bfloat16"),
    "output-attentions": (lambda m, d: {"output_attentions": True}, "output_attentions"),
    "packed-into-cache": (lambda m, d: {"position_ids": torch.tensor([[0, 1, 2, 0, 1, 2, 3, 4]], device=d),
                                        "use_cache": True}, "cannot fill a KV cache"),
    "static-cache": (lambda m, d: _static_cache(m), "DynamicCache"),
}


@pytest.mark.parametrize("case", list(CALL_REFUSALS))
def test_bad_call_is_refused_before_any_op_runs(case, weights, seqs, device):
    _needs("triton_cuda_bf16")
    m = hf_model(weights, device)
    make, match = CALL_REFUSALS[case]
    with hfk.apply(m) as h:
        spy = h.ops = Spy(h.ops)
        inputs = {"input_ids": layout("rows", seqs, device)[0]["input_ids"], **make(m, device)}
        with pytest.raises(InputError, match=match), torch.no_grad():
            m(**inputs)
        assert spy.calls == [], spy.calls


def test_the_spy_sees_a_good_call_and_other_refusals(weights, seqs, device):
    """Control for the test above (a good call is recorded), and the refusals outside a forward:
    logprobs of an unpatched model, an unknown head, attention switched after apply."""
    _needs("triton_cuda_bf16")
    m = hf_model(weights, device)
    ids = torch.stack([seqs[0], seqs[0]])
    with pytest.raises(InputError, match="patched by"):
        hfk.logprobs(m, ids)
    with hfk.apply(m) as h:
        spy = h.ops = Spy(h.ops)
        with pytest.raises(InputError, match="head must be one of"):
            hfk.logprobs(m, ids, head="softmax")
        m.set_attn_implementation("eager")
        with pytest.raises(InputError, match="after apply"), torch.no_grad():
            m(ids)
        m.set_attn_implementation("rl_engine")
        assert spy.calls == []
        with torch.no_grad():
            m(ids[:1, :3])
        assert spy.calls[:3] == ["embedding", "layer0.input_layernorm", "layer0.q_proj"]
        assert "layer1.attention" in spy.calls and spy.calls[-2:] == ["final_norm", "lm_head"]
    assert untouched(m)


# -- 5. a training step -------------------------------------------------------------------------------
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_training_step_runs_and_stays_on_the_chain(backend, weights, seqs, device):
    """loss = -mean logprob over the real tokens, backward, SGD; then Hugging Face's own ``labels``
    loss. The step changes the weights in place; the chain, on weights that share their storage,
    still gives the patched model's bits afterwards."""
    _needs(backend)
    m = hf_model(weights, device).train()
    inputs, held = layout("padded", seqs, device)
    opt = torch.optim.SGD(m.parameters(), lr=1.0)
    before = {n: p.detach().clone() for n, p in m.named_parameters()}
    with hfk.apply(m, backend):
        out = hfk.logprobs(m, **inputs)
        loss = -out.logprobs[out.mask].mean()
        loss.backward()
        assert torch.isfinite(loss) and all(p.grad is not None for p in m.parameters())
        opt.step()
        opt.zero_grad(set_to_none=True)
        moved = [n for n, p in m.named_parameters() if not _same_bits(p, before[n])]
        assert len(moved) == len(before), sorted(set(before) - set(moved))
        with torch.no_grad():
            after = hfk.logprobs(m, **inputs)
        ref = chain_logprobs(m, held, backend, "lm_head_logp")
        assert _same_bits(after.logprobs[after.mask], ref), _mismatch(after.logprobs[after.mask], ref)
        labels = inputs["input_ids"].masked_fill(inputs["attention_mask"] == 0, -100)
        hf_loss = m(**inputs, labels=labels).loss
        hf_loss.backward()
        assert torch.isfinite(hf_loss) and m.lm_head.weight.grad is not None
    assert untouched(m.eval())


# -- the rollout engine and the KV cache ----------------------------------------------------------------
@pytest.mark.parametrize("backend", BACKENDS)
def test_sampled_logprobs_of_the_rollout_engine_are_the_same_bits(backend, weights, seqs, device):
    """``rl_engine.rollout.generate`` on the chain over the model's own weights samples tokens;
    the patched model scores prompt + completion and gives the sampler's logprobs bit for bit."""
    from rl_engine.rollout import generate

    _needs(backend)
    m = hf_model(weights, device)
    chain = Qwen3Model(hfk.qwen3_weights(m), backend)
    prompts = [seqs[0][:4].tolist(), seqs[1][:3].tolist()]
    res = generate(chain, prompts, 3, temperature=1.0, seed=3)
    with hfk.apply(m, backend), torch.no_grad():
        for c in res.completions:
            ids = torch.tensor([list(c.prompt) + c.tokens.tolist()], device=device)
            got = hfk.logprobs(m, ids).logprobs[0, len(c.prompt) - 1:].cpu()
            assert _same_bits(got, c.logprobs), _mismatch(got, c.logprobs)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_cache_continuation_gives_the_full_forwards_bits(backend, weights, seqs, device):
    """Prefill 5 tokens into a DynamicCache, then 3 more against it: the logits of the full
    forward, bit for bit (queries aligned to the end of their keys). Hugging Face's greedy
    ``generate`` then runs on the patched model and picks the argmax of those logits."""
    _needs(backend)
    m = hf_model(weights, device)
    ids = seqs[0][None]
    with hfk.apply(m, backend), torch.no_grad():
        full = m(ids, use_cache=False).logits
        first = m(ids[:, :5], use_cache=True)
        with pytest.raises(InputError, match="with 5 cached tokens"):  # positions that ignore the cache
            m(ids[:, 5:], **_cache_kw(m, first), position_ids=torch.arange(3, device=device)[None])
        rest = m(ids[:, 5:], **_cache_kw(m, first), use_cache=True)
        gen = m.generate(ids[:, :5], max_new_tokens=2, do_sample=False)
        again = m(gen[:, :-1], use_cache=False).logits
    assert _same_bits(first.logits, full[:, :5]) and _same_bits(rest.logits, full[:, 5:]), _mismatch(rest.logits,
                                                                                                     full[:, 5:])
    assert torch.equal(gen[:, :5], ids[:, :5]) and torch.equal(gen[0, 5:], again[0, 4:].argmax(-1))


def test_attention_takes_the_forwards_plan_in_every_layer(weights, seqs, device, monkeypatch):
    """The patched forward checks its packed sequences once, from the host lists it built (no
    device read), and every layer's attention takes that plan (``check_varlen_planned``: its
    tensors against the plan) instead of reading cu_seqlens on the host again (each read stalls
    the GPU's launch queue); same logprobs. Control: a table whose attention takes no plan checks
    cu_seqlens itself in every layer."""
    _needs("triton_cuda_bf16")
    import rl_engine.ops.attention.op as attn_op
    from rl_engine.ops.attention.op import attention_triton

    planned, unplanned = [], []
    for name, log in (("check_varlen_planned", planned), ("check_varlen", unplanned)):
        real = getattr(attn_op, name)
        monkeypatch.setattr(attn_op, name, lambda *a, _real=real, _log=log, **k: _log.append(1) or _real(*a, **k))
    m = hf_model(weights, device)
    inputs, _ = layout("packed", seqs, device)
    layers = len(weights.layers)
    counts, lps = [], []
    for no_plan in (False, True):
        planned.clear()
        unplanned.clear()
        with hfk.apply(m, "triton_cuda_bf16") as h:
            if no_plan:
                h.ops = h.ops.replace(attention=lambda **kw: attention_triton(**kw))
            with torch.no_grad():
                lps.append(hfk.logprobs(m, **inputs).logprobs)
        counts.append((len(planned), len(unplanned)))
    # with the plan: every layer planned; the plan itself was checked (check_varlen) by the
    # forward and by logprobs' own look at the inputs, not by any layer
    assert counts[0] == (layers, 2), counts
    assert counts[1] == (0, layers), counts  # control
    assert _same_bits(lps[0], lps[1])
