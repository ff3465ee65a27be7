"""The engine: a sequence's tokens and logprobs are the same bits alone, in a full static batch and
when it joins a running batch mid-way (with a row-keyed sampler as the negative control), and the
RL form of parity: teacher forcing scores the sampled tokens to the rollout's bits."""

from __future__ import annotations

import pytest
import torch

from rl_engine.chain.scoring import SeqBatch, score_teacher_forcing
from rl_engine.rollout import generate, score_completions
from rl_engine.rollout.compare import compare_completions
from rl_engine.rollout.sampling import RowKeyedSampler

PROMPTS = ([5, 17, 300], [42, 7], [100, 200, 300, 400])
BUDGETS = [2, 3, 2]  # A stops after one decode step, B runs on, C takes A's slot while B is running
FILTERED = dict(temperature=0.8, top_k=64, top_p=0.9, seed=1234)


@pytest.fixture(scope="module")
def alone(rollout_model):
    """Each sequence on its own (max_batch=1), keyed by its id in the batch."""
    return [generate(rollout_model, [p], [b], seq_ids=[i], max_batch=1, **FILTERED).completions[0]
            for i, (p, b) in enumerate(zip(PROMPTS, BUDGETS))]


@pytest.fixture(scope="module")
def continuous(rollout_model):
    return generate(rollout_model, PROMPTS, BUDGETS, max_batch=2, **FILTERED)


def test_continuous_batching_is_bitwise_batch_invariant(rollout_model, alone, continuous):
    static = generate(rollout_model, PROMPTS, BUDGETS, max_batch=3, **FILTERED)
    # the schedules really differ: all three start together in the static batch; with two slots,
    # C (seq 2) is prefilled into A's slot after one decode step, while B is still running
    assert [a[1:] for a in static.admissions] == [(0, 0), (1, 0), (2, 0)]
    assert continuous.admissions == ((0, 0, 0), (1, 1, 0), (2, 0, 1))
    assert [int(c.tokens.numel()) for c in continuous.completions] == BUDGETS  # queued, not truncated
    assert all(c.logprobs.dtype == torch.float32 and bool(torch.isfinite(c.logprobs).all())
               and c.finish_reason == "length" for c in continuous.completions)  # no NaN-filled slot was read
    for other in (static.completions, continuous.completions):
        rep = compare_completions(alone, other)
        assert rep.equal and rep.compared == (0, 1, 2), rep.summary()


def test_invariance_check_catches_a_row_keyed_sampler(rollout_model):
    """Negative control: noise keyed by the cache slot. A (budget 2) holds slot 0, so B and C (one
    token each) are prefilled into slot 1 one after the other, and into slot 0 when alone: the same
    comparison must report them. (One drawn token agrees by chance with probability sum_v p_v^2, a
    few percent here; two are compared, and the seeds are fixed, so the outcome is deterministic.)"""
    batch = generate(rollout_model, PROMPTS, [2, 1, 1], max_batch=3, sampler=RowKeyedSampler(), **FILTERED)
    assert batch.admissions == ((0, 0, 0), (1, 1, 0), (2, 1, 0))
    solo = [generate(rollout_model, [PROMPTS[i]], 1, seq_ids=[i], max_batch=1, sampler=RowKeyedSampler(),
                     **FILTERED).completions[0] for i in (1, 2)]
    rep = compare_completions(solo, batch.completions)
    assert rep.compared == (1, 2) and not rep.equal
    assert any(": token 0 is" in m for m in rep.mismatches), rep.summary()


def _batch_size_dependent_model(weights):
    """NEGATIVE CONTROL: the micro model with an lm_head that rounds its logits to BF16 when it gets
    more than one row (a "decode fast path", docs/pitfalls.md P5 made size dependent)."""
    from rl_engine.chain.model import Qwen3Model

    model = Qwen3Model(weights, "triton_cuda_bf16")
    exact = model.ops.impl("lm_head")

    def size_dependent(hidden, weight):
        logits = exact(hidden=hidden, weight=weight)
        return logits if hidden.shape[0] == 1 else logits.to(torch.bfloat16).to(torch.float32)

    model.ops = model.ops.replace(lm_head=size_dependent)
    return model


def test_invariance_check_catches_a_batch_dependent_kernel(rollout_weights, alone):
    """Negative control at the kernel level: an lm_head that rounds the logits to BF16 when it gets
    more than one row (a "decode fast path", docs/pitfalls.md P5 made size dependent). A run alone only ever
    gives it one row, so the alone results above stand for it; two-slot decode steps must be caught."""
    model = _batch_size_dependent_model(rollout_weights)
    res = generate(model, PROMPTS, BUDGETS, max_batch=2, **FILTERED)
    rep = compare_completions(alone, res.completions)
    assert rep.compared == (0, 1, 2) and not rep.equal
    assert any(m.startswith("seq 0: logprob 1 ") for m in rep.mismatches), rep.summary()


def test_teacher_forcing_scores_the_filtered_samples_to_the_same_bits(rollout_model, continuous):
    # two forwards (sequences 0-1, then 2): the trainer's micro-batching does not move a bit either
    scored = score_completions(rollout_model, continuous.completions, continuous.sampling, micro_batch=2)
    assert len(scored) == 3
    for c, lp in zip(continuous.completions, scored):
        assert torch.equal(lp.view(torch.int32), c.logprobs.view(torch.int32)), (c.seq_id, lp, c.logprobs)


def test_teacher_forcing_scores_temperature_one_samples_to_the_same_bits(rollout_model):
    """Temperature 1, no top-k / top-p: the chain's own training-style scorer
    (score_teacher_forcing, lm_head + logp head) gives the rollout's logprobs bit for bit."""
    res = generate(rollout_model, PROMPTS[:2], 2, max_batch=2, temperature=1.0, seed=7)
    batch = SeqBatch(tuple(torch.tensor(c.prompt + tuple(c.tokens.tolist()), dtype=torch.int64)
                           for c in res.completions), tuple(len(c.prompt) for c in res.completions))
    train = score_teacher_forcing(rollout_model, batch, head="lm_head_logp", temperature=1.0).cpu()
    roll = torch.cat([c.logprobs for c in res.completions])
    assert torch.equal(train.view(torch.int32), roll.view(torch.int32)), (train, roll)


def test_stop_token_ends_a_sequence_and_is_kept(rollout_model, alone):
    """A stop token equal to B's second drawn token ends B in the decode step that draws it (finish
    "stop", the token kept), and A, which does not draw it, is unaffected."""
    stop = int(alone[1].tokens[1])
    ref = alone[1].tokens.tolist()
    n = ref.index(stop) + 1
    assert stop not in alone[0].tokens[:1].tolist()
    res = generate(rollout_model, PROMPTS[:2], [1, 3], max_batch=2, stop_token_ids=[stop], **FILTERED)
    b = res.completions[1]
    assert b.tokens.tolist() == ref[:n] and b.finish_reason == "stop" and res.decode_steps == n - 1
    assert torch.equal(b.logprobs.view(torch.int32), alone[1].logprobs[:n].view(torch.int32))
    assert res.completions[0].tokens.tolist() == alone[0].tokens[:1].tolist()


def test_the_command_prints_the_same_samples_as_the_api(rollout_weights, alone, tmp_path, capsys):
    """``rl-engine generate --json`` on a checkpoint of the same weights: the same tokens and
    logprob bits as the API (B's first two tokens: a smaller budget leaves the prefix unchanged)."""
    import json

    from rl_engine.chain.weights import save_checkpoint
    from rl_engine.cli.main import main

    ckpt = save_checkpoint(rollout_weights, tmp_path / "ckpt")
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("# two prompts\n5 17 300\n\n42, 7\n")
    rc = main(["generate", "--model", str(ckpt), "--prompts", str(prompts), "--max-new-tokens", "2",
               "--temperature", "0.8", "--top-k", "64", "--top-p", "0.9", "--seed", "1234", "--max-batch", "2",
               "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and out["generated_tokens"] == 4 and out["tokens_per_s"] > 0 and out["triton_interpreter"] in (
        True, False)
    for got, ref in zip(out["completions"], alone[:2]):
        assert got["tokens"] == ref.tokens[:2].tolist()
        assert got["logprobs"] == [float(x) for x in ref.logprobs[:2]]


def test_batch_size_buckets_keep_the_bits(rollout_model, rollout_weights):
    """With three slots, A (budget 4) in slot 0 outlives B and C (budget 2): the engine steps all three
    slots once, then only the bucket of one slot, and every token and logprob is the bit of the run
    that steps every slot every time. Control: with an lm_head whose logits depend on the batch size
    (BF16-rounded above one row), the two schedules must differ."""
    from rl_engine.rollout.engine import bucket_sizes

    assert bucket_sizes(3) == (1, 2, 3) and bucket_sizes(64) == (1, 2, 4, 8, 16, 32, 64) and bucket_sizes(1) == (1,)
    budgets = [4, 2, 2]
    kw = dict(max_batch=3, temperature=1.0, seed=77)
    bucketed = generate(rollout_model, PROMPTS, budgets, buckets=True, **kw)
    full = generate(rollout_model, PROMPTS, budgets, buckets=False, **kw)
    assert bucketed.bucket_steps == ((1, 2), (3, 1)) and full.bucket_steps == ((3, 3),)
    rep = compare_completions(full.completions, bucketed.completions)
    assert rep.equal and rep.compared == (0, 1, 2), rep.summary()

    model = _batch_size_dependent_model(rollout_weights)
    ctrl = compare_completions(generate(model, PROMPTS, budgets, buckets=False, **kw).completions,
                               generate(model, PROMPTS, budgets, buckets=True, **kw).completions)
    assert not ctrl.equal and all(m.startswith("seq 0:") for m in ctrl.mismatches), ctrl.summary()
