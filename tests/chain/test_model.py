"""The Qwen3 chain on the tiny model: docs/pitfalls.md P1 and P8 at chain level, the strict profile in the
Triton interpreter, reference vs torch_bf16 sanity, and first-divergence localisation."""

from __future__ import annotations

import pytest
import torch

from rl_engine.chain.fixtures import make_fixture
from rl_engine.chain.model import LAYER_OP_ORDER, Qwen3Model
from rl_engine.chain.scoring import SeqBatch, score_rollout, score_teacher_forcing
from rl_engine.chain.parity import (ActivationRecorder, PlantedChange, first_divergence_from,
                                    localize_first_divergence)
from rl_engine.errors import InputError
from rl_engine.gate.compare import chain_metrics

TRITON = "triton_cuda_bf16"


def _bitwise(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype == torch.float32 and a.shape == b.shape and torch.equal(
        a.view(torch.int32), b.view(torch.int32))


@pytest.fixture(scope="module")
def triton_model(tiny_weights):
    return Qwen3Model(tiny_weights, TRITON)


@pytest.fixture(scope="module")
def pitfall_model(request):
    """The model of the P1 / P8 tests: P1's tiny model on a GPU; on a CPU the 2-layer micro model
    (``tests/chain/conftest.py``), whose forwards cost the Triton interpreter about a quarter of
    tiny-smoke's. The subject is the chain's bitwise invariance, which does not depend on the sizes;
    tiny-smoke's chain parity runs on the CPU in the smoke gate cell below."""
    if torch.cuda.is_available():
        return request.getfixturevalue("triton_model")
    return Qwen3Model(request.getfixturevalue("micro_weights"), TRITON)


# ---------------------------------------------------------------- P1: micro-batch size
def test_p1_micro_batching_is_bitwise_invariant(pitfall_model, contract):
    fx = make_fixture("p1", 11, pitfall_model.config.vocab_size)
    assert [int(t.numel()) for t in fx.tokens] == list(range(5, 13))
    batch = fx.batch()
    whole = score_teacher_forcing(pitfall_model, batch)
    pairs = score_teacher_forcing(pitfall_model, batch, micro_batch=2)
    single = score_teacher_forcing(pitfall_model, batch, micro_batch=1)
    assert whole.dtype == torch.float32 and whole.numel() == batch.active_tokens == 60
    assert _bitwise(whole, pairs) and _bitwise(whole, single)
    rep = chain_metrics(whole, single, contract.chain_thresholds("strict"))
    assert rep.passed and rep.metrics["max_abs_dlogp"]["value"] == 0 and rep.metrics["approx_kl0"]["value"] == 0


def test_p1_check_catches_a_batch_dependent_gemm(micro_weights, contract):
    """Negative control: det_gemm with a tree depth chosen from M (1 above 8 rows, else 2) makes
    row bits depend on the batch, and the same bitwise check must fail."""
    from rl_engine.ops.det_gemm.api import det_gemm_triton

    model = Qwen3Model(micro_weights, TRITON)
    model.ops = model.ops.replace(det_gemm=lambda a, b: det_gemm_triton(a, b, tree_depth=1 if a.shape[0] > 8 else 2))
    batch = make_fixture("p1", 11, model.config.vocab_size).batch()
    both = score_teacher_forcing(model, batch.subset([0, 1]))  # lengths 5 + 6: M = 11 rows
    alone = score_teacher_forcing(model, batch.subset([0]))  # M = 5 rows
    assert not _bitwise(both[: alone.numel()], alone)
    assert not chain_metrics(both[: alone.numel()], alone, contract.chain_thresholds("strict")).passed


# ---------------------------------------------------------------- P8: prefill + decode == teacher forcing
def test_p8_prefill_plus_decode_equals_teacher_forcing(pitfall_model, contract):
    fx = make_fixture("p8", 3, pitfall_model.config.vocab_size)
    batch = fx.batch()
    assert batch.prompt_lens == (16,) and batch.completion_lens() == [9]  # 16-token prefill + 8 decode steps
    from rl_engine.chain.scoring import TokenKeys

    keys = TokenKeys(batch)
    rt, rr = ActivationRecorder(keys.total), ActivationRecorder(keys.total)
    train = score_teacher_forcing(pitfall_model, batch, recorder=rt)
    roll = score_rollout(pitfall_model, batch, recorder=rr)
    assert _bitwise(train, roll)
    assert chain_metrics(train, roll, contract.chain_thresholds("strict")).passed
    # every activation of every op at positions 0..23 (K/V written to the cache included) is bitwise equal
    assert first_divergence_from(rt, rr, batch) is None
    assert all(bool(rr.seen[f"layer0.{op}"][:24].all()) for op in LAYER_OP_ORDER)


# ---------------------------------------------------------------- strict profile (gate cell, smoke)
def test_smoke_gate_cell_is_green_in_strict_profile(contract):
    from rl_engine.chain.gate import chain_parity_cell

    status, reason, details, kid = chain_parity_cell(TRITON, "smoke", contract, 0)
    assert status == "green", reason
    assert details["profile"] == "strict" and details["strict"]["passed"] and details["ws1"]["passed"]
    for key in ("active_tokens", "seeds", "fixture_hash", "max_abs_dlogp", "mean_abs_dlogp", "approx_kl0",
                "clipfrac0", "p99_abs_dlogp", "p999_abs_dlogp", "baseline_torch_bf16", "vs_reference"):
        assert key in details, key
    assert details["max_abs_dlogp"] == 0 and details["bitwise_equal_tokens"] == details["active_tokens"]
    assert details["first_divergence"] is None
    assert kid.startswith(f"chain/{TRITON}/")
    rl = details["rl_form"]  # the RL form: generate, then teacher forcing of the samples
    assert {"temperature_1", "top_p_0.9"} <= set(rl) and "RL form: all" in reason
    assert all(rl[k]["bitwise_equal"] and rl[k]["sampled_tokens"] > 0 for k in ("temperature_1", "top_p_0.9"))


def test_second_backend_reuses_the_reference_and_baseline_runs(contract):
    """Two chain cells in one process (same seed and workload): the second reuses the FP32
    reference and torch_bf16 baseline results and reports the same baseline numbers. The reuse key
    holds no backend (the gold and the baseline do not depend on the judged one), so the second
    cell is torch_bf16 again rather than an interpreter run of Triton: the same mechanism, a
    fortieth of the time on a CPU."""
    from rl_engine.chain import gate as chain_gate

    chain_gate._SHARED_RUNS.clear()
    _, _, first, _ = chain_gate.chain_parity_cell("torch_bf16", "smoke", contract, 7, rl_form=False)
    _, _, second, _ = chain_gate.chain_parity_cell("torch_bf16", "smoke", contract, 7, rl_form=False)
    assert [r["reference_and_baseline"] for r in first["per_run"]] == ["computed"]
    assert [r["reference_and_baseline"] for r in second["per_run"]] == ["reused from an earlier cell in this process"]
    assert second["baseline_torch_bf16"] == first["baseline_torch_bf16"]
    # a different seed is a different run: computed again
    _, _, third, _ = chain_gate.chain_parity_cell("torch_bf16", "smoke", contract, 8, rl_form=False)
    assert [r["reference_and_baseline"] for r in third["per_run"]] == ["computed"]


# ---------------------------------------------------------------- reference vs torch_bf16 sanity
def test_reference_and_torch_bf16_chains_agree(tiny_weights, triton_model, contract):
    """The three chains compute one model: the FP32 chain agrees with itself across styles (FP32
    logprob tier), the BF16 chains' final hidden states agree with the FP32 chain (reduction class,
    BF16 tier), and our chain's errors stay within the relative criterion of the torch_bf16 chain's."""
    from rl_engine.gate.compare import compare_accuracy, compare_relative

    batch = make_fixture("smoke", 5, tiny_weights.config.vocab_size).batch()
    ref = Qwen3Model(tiny_weights, "reference_fp32")
    bf = Qwen3Model(tiny_weights, "torch_bf16")
    ref_tf, ref_ro = score_teacher_forcing(ref, batch), score_rollout(ref, batch)
    tol32 = contract.tolerance("forward", "logprob", "float32")
    torch.testing.assert_close(ref_ro, ref_tf, atol=tol32.atol, rtol=tol32.rtol)

    lens = [int(t.numel()) for t in batch.tokens]
    ids = torch.cat(list(batch.tokens)).to(ref.device)
    pos = torch.cat([torch.arange(n) for n in lens]).to(ref.device)
    cu = torch.tensor([sum(lens[:i]) for i in range(len(lens) + 1)], dtype=torch.int32, device=ref.device)
    h_ref = ref.forward(ids, pos, cu_seqlens=cu)
    h_bf = bf.forward(ids, pos, cu_seqlens=cu)
    h_tr = triton_model.forward(ids, pos, cu_seqlens=cu)
    assert h_ref.dtype == torch.float32 and h_bf.dtype == h_tr.dtype == torch.bfloat16
    tol = contract.tolerance("forward", "reduction", "bfloat16")
    acc_bf = compare_accuracy("chain.final_norm[torch_bf16]", h_bf, h_ref, tol)
    acc_tr = compare_accuracy("chain.final_norm[triton]", h_tr, h_ref, tol)
    assert acc_bf.passed, acc_bf.summary()
    assert acc_tr.passed, acc_tr.summary()
    k = contract.relative_factor("forward")
    rel = compare_relative("chain.final_norm", acc_tr.max_abs_error, acc_bf.max_abs_error, k)
    assert rel.passed, rel.summary()
    # logprobs of the completion tokens from those hidden rows: ours vs FP32 within k x the torch_bf16 chain's error
    rows = torch.tensor([int(cu[b]) + p - 1 for b, tok in enumerate(batch.tokens)
                         for p in range(batch.prompt_lens[b], int(tok.numel()))], device=ref.device)
    tgt = torch.cat([tok[p:] for tok, p in zip(batch.tokens, batch.prompt_lens)]).to(ref.device)
    lp_ref = ref.logprobs(h_ref[rows], tgt)
    torch.testing.assert_close(lp_ref, ref_tf, atol=tol32.atol, rtol=tol32.rtol)
    err_bf = float((bf.logprobs(h_bf[rows], tgt) - lp_ref).abs().max())
    err_tr = float((triton_model.logprobs(h_tr[rows], tgt) - lp_ref).abs().max())
    assert compare_relative("chain.logp", err_tr, err_bf, k).passed, (err_tr, err_bf)


def test_reference_runs_in_fp32(tiny_weights):
    ref = Qwen3Model(tiny_weights, "reference_fp32")
    assert ref.dtype == torch.float32 and ref.weights.layers[0].q_proj.dtype == torch.float32
    assert torch.equal(ref.weights.layers[0].q_proj, tiny_weights.layers[0].q_proj.float())


# ---------------------------------------------------------------- first-divergence localisation
@pytest.fixture(scope="module")
def micro_triton(micro_weights):
    return Qwen3Model(micro_weights, TRITON)


def test_localisation_names_a_planted_difference(micro_triton):
    batch = make_fixture(((3, 2), (4, 3)), 9, micro_triton.config.vocab_size).batch()
    key = 5 + 5  # sequence 1 (its keys start at L_0 = 5), position 5: fed in decode step 1
    plant = PlantedChange(None, "layer1.swiglu", key, index=3)
    found = localize_first_divergence(micro_triton, batch, rollout_hook=plant)
    assert plant.applied >= 1
    assert found is not None
    assert (found["layer"], found["op"]) == (1, "swiglu")
    assert found["token"]["seq"] == 1 and found["token"]["pos"] == 5
    assert found["element"]["first_element"] == 3 and found["element"]["differing_elements"] == 1
    assert found["differing_tokens"] == 1  # later tokens differ only from the next layer's attention on


def test_localisation_on_a_prompt_token_in_layer0(micro_triton):
    batch = make_fixture(((4, 2),), 9, micro_triton.config.vocab_size).batch()
    found = localize_first_divergence(micro_triton, batch, detail=False,
                                      train_hook=PlantedChange(None, "layer0.k_rope", 1, index=0))
    assert found is not None and (found["layer"], found["op"]) == (0, "k_rope")
    assert found["token"] == {"seq": 0, "pos": 1, "key": 1, "role": "prompt"}


def test_localisation_finds_the_fp32_reference_divergence(tiny_weights):
    """The FP32 reference chain is not bitwise equal across styles (FP32 attention over a different
    number of keys per call); localisation names an op and a token."""
    ref = Qwen3Model(tiny_weights, "reference_fp32")
    batch = make_fixture("smoke", 1, tiny_weights.config.vocab_size).batch()
    found = localize_first_divergence(ref, batch)
    assert found is not None and found["op"] in LAYER_OP_ORDER + ("final_norm", "logp", "embedding")
    assert found["element"]["differing_elements"] >= 1


# ---------------------------------------------------------------- input checks
def test_bad_batches_raise():
    t = torch.arange(6, dtype=torch.int64)
    with pytest.raises(InputError, match="prompt length"):
        SeqBatch((t,), (6,))
    with pytest.raises(InputError, match="int64"):
        SeqBatch((t.int(),), (2,))
    with pytest.raises(InputError, match="prompt lengths"):
        SeqBatch((t, t), (2,))


def test_weights_dtype_is_checked(tiny_weights):
    with pytest.raises(InputError, match="bfloat16"):
        Qwen3Model(tiny_weights.upcast(), "torch_bf16")


def test_positions_beyond_table_raise(tiny_weights):
    m = Qwen3Model(tiny_weights, "torch_bf16")
    with pytest.raises(InputError, match="max_position_embeddings"):
        m.rope_tables(torch.tensor([tiny_weights.config.max_position_embeddings], device=m.device))


# ---------------------------------------------------------------- decode without host syncs
def test_rollout_decode_reads_no_device_value_once_the_plan_is_validated(micro_weights, monkeypatch):
    """score_rollout validates every position of its plan once, on the host, before the prefill;
    its forwards then never read a device value back (the position check is the only such read
    in the model). Control: an unchecked decode forward does run it, and bad positions still get
    a clear error."""
    from rl_engine.chain.model import KVCache

    model = Qwen3Model(micro_weights, "torch_bf16")
    batch = make_fixture(((3, 2), (4, 3)), 9, model.config.vocab_size).batch()
    reads = []
    real = Qwen3Model._check_device_positions
    monkeypatch.setattr(Qwen3Model, "_check_device_positions",
                        lambda self, *a, **k: (reads.append(a[-1]), real(self, *a, **k)))
    checked = score_rollout(model, batch)
    assert reads == [] and checked.numel() == batch.active_tokens
    cache = KVCache.allocate(model.config, 1, 4, model.dtype, model.device)
    ids = torch.zeros(1, dtype=torch.int64, device=model.device)
    model.forward(ids, torch.zeros_like(ids), cache=cache, decode=True)
    assert reads == ["decode"]
    with pytest.raises(InputError, match="S_max=4"):
        model.forward(ids, torch.full_like(ids, 4), cache=cache, decode=True)
    with pytest.raises(InputError, match="max_position_embeddings"):
        model.check_positions(0, model.config.max_position_embeddings)


def test_packed_projections_give_the_unpacked_bits(device):
    """``forward(packed=True)`` runs q/k/v and gate/up as one det_gemm each over row-stacked weights
    (the rollout engine's form): hidden states of a packed prefill with a KV cache and of a decode
    step are bitwise the unpacked ones, the layer's fields become row views of the stacked weights
    (no copy kept, values unchanged), and packing twice reuses them. Control: a stacking in the
    wrong order (v before k) changes the bits."""
    from rl_engine.chain.config import Qwen3Config
    from rl_engine.chain.model import KVCache
    from rl_engine.chain.weights import PackedProjections, pack_projections, synthetic_weights

    from conftest import MICRO

    w = synthetic_weights(Qwen3Config(**MICRO), 3, logit_scale=2.0, device=device)
    before = [lw.k_proj.clone() for lw in w.layers]
    model = Qwen3Model(w, TRITON)
    ids = torch.tensor([5, 9, 2, 7, 1], dtype=torch.int64, device=device)
    pos = torch.arange(5, dtype=torch.int64, device=device)
    cu = torch.tensor([0, 5], dtype=torch.int32, device=device)

    def run(packed: bool) -> tuple[torch.Tensor, torch.Tensor]:
        cache = KVCache.allocate(model.config, 1, 8, model.dtype, model.device)
        pre = model.forward(ids, pos, cu_seqlens=cu, cache=cache, packed=packed)
        dec = model.forward(ids[:1], pos[:1] + 5, cache=cache, decode=True, packed=packed)
        return pre, dec

    plain = run(False)
    packed = run(True)
    for a, b in zip(plain, packed):
        assert torch.equal(a.view(torch.int16), b.view(torch.int16))
    pk = model.packed_projections()
    for lw, old, p in zip(w.layers, before, pk):
        assert lw.q_proj._base is p.qkv and lw.up_proj._base is p.gate_up and torch.equal(lw.k_proj, old)
    assert pack_projections(w.layers[0]).qkv is pk[0].qkv  # already stacked: reused
    lw = w.layers[0]
    wrong = PackedProjections(torch.cat([lw.q_proj, lw.v_proj, lw.k_proj]), pk[0].gate_up)
    model._packed = [wrong] + pk[1:]
    assert not torch.equal(run(True)[0].view(torch.int16), plain[0].view(torch.int16))


# ---------------------------------------------------------------- host reads of cu_seqlens
def _count_cu_reads(monkeypatch, model: Qwen3Model, ops=None) -> tuple[int, torch.Tensor]:
    """Run one packed forward and count the host reads of cu_seqlens (``check_cu_seqlens`` calls;
    each is a device-to-host copy that stalls the launch queue on a GPU)."""
    import rl_engine.ops.attention._checks as checks

    calls = []
    real = checks.check_cu_seqlens
    monkeypatch.setattr(checks, "check_cu_seqlens", lambda *a, **k: calls.append(a[0]) or real(*a, **k))
    dev = model.device
    ids = torch.tensor([3, 1, 4, 1, 5, 9, 2], dtype=torch.int64, device=dev)
    positions = torch.tensor([0, 1, 2, 0, 1, 2, 3], dtype=torch.int64, device=dev)
    cu = torch.tensor([0, 3, 7], dtype=torch.int32, device=dev)
    hidden = model.forward(ids, positions, cu_seqlens=cu, checked=True, ops=ops)
    return len(calls), hidden


def test_packed_forward_reads_cu_seqlens_once(monkeypatch, micro_triton):
    """The forward builds the attention plan once (cu_seqlens_q and _k: two checks of one host
    read each), not once per layer; the control table, whose attention takes no plan, reads it in
    every layer (the count this test must see differ), and both give the same bits."""
    from rl_engine.ops.attention.op import attention_triton

    layers = micro_triton.config.num_hidden_layers
    assert layers >= 2
    once, hidden = _count_cu_reads(monkeypatch, micro_triton)
    assert once == 2
    no_plan = micro_triton.ops.replace(attention=lambda **kw: attention_triton(**kw))
    assert not no_plan.accepts("attention", "plan") and micro_triton.ops.accepts("attention", "plan")
    per_layer, control = _count_cu_reads(monkeypatch, micro_triton, no_plan)
    assert per_layer == 2 * layers
    assert torch.equal(hidden.view(torch.int16), control.view(torch.int16))
