"""The RL form of chain parity in the gate's chain cell (issue #19): completions sampled by the
rollout engine, scored again by teacher forcing, must carry the same logprob bits; with a control
whose teacher forcing scores under another distribution, the check must fail."""

from __future__ import annotations

import dataclasses

import pytest

from rl_engine.chain import gate as chain_gate
from rl_engine.chain.fixtures import make_fixture
from rl_engine.chain.model import Qwen3Model

SIZE = {"prompts": 2, "prompt_len": 3, "new_tokens": 2}


@pytest.fixture(scope="module")
def micro_model(micro_weights):
    return Qwen3Model(micro_weights, "triton_cuda_bf16")


def test_rl_form_holds_on_the_micro_model(micro_model):
    batch = make_fixture(((5, 3), (6, 2)), 4, micro_model.config.vocab_size).batch()
    rep = chain_gate.rl_form_parity(micro_model, batch, SIZE, seed=7)
    assert [name for name, _ in chain_gate.RL_FORM_SAMPLING] == list(rep)
    for name, r in rep.items():
        assert r["sampled_tokens"] == SIZE["prompts"] * SIZE["new_tokens"], name
        assert r["bitwise_equal"] and r["differing_logprobs"] == 0, (name, r)


def test_rl_form_control_scoring_under_another_temperature_fails(micro_model, monkeypatch):
    """Control: teacher forcing that scores the samples at temperature 1.25 instead of the sampling
    temperature gives other logprobs, and the report says so."""
    import rl_engine.rollout as rollout

    real = rollout.score_completions

    def wrong(model, completions, params, **kw):
        return real(model, completions, dataclasses.replace(params, temperature=1.25), **kw)

    monkeypatch.setattr(rollout, "score_completions", wrong)
    batch = make_fixture(((5, 3), (6, 2)), 4, micro_model.config.vocab_size).batch()
    rep = chain_gate.rl_form_parity(micro_model, batch, SIZE, seed=7)
    assert all(not r["bitwise_equal"] and r["differing_logprobs"] > 0 for r in rep.values())
