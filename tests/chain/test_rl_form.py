"""The RL form of chain parity in the gate's chain cell (issue #19): completions sampled by the
rollout engine, scored again by teacher forcing, must carry the same logprob bits. The positive
case runs in every smoke gate (its chain cell is red otherwise, and CI runs the gate); here the
control: teacher forcing that scores under another distribution must make the check fail."""

from __future__ import annotations

import dataclasses

import pytest

from rl_engine.chain import gate as chain_gate
from rl_engine.chain.fixtures import make_fixture
from rl_engine.chain.model import Qwen3Model

SIZE = {"prompts": 2, "prompt_len": 3, "new_tokens": 2}


def test_rl_form_settings_are_temperature_1_and_top_p():
    assert dict(chain_gate.RL_FORM_SAMPLING) == {"temperature_1": {"temperature": 1.0},
                                                 "top_p_0.9": {"temperature": 1.0, "top_p": 0.9}}
    assert all("rl_form" in plan for plan in chain_gate.PLANS.values())


def test_rl_form_holds_and_its_control_fails(micro_weights, monkeypatch):
    """On the micro model the samples' logprobs are the same bits both ways; with teacher forcing
    scoring at temperature 1.25 instead of the sampling temperature they are not."""
    import rl_engine.rollout as rollout

    model = Qwen3Model(micro_weights, "triton_cuda_bf16")
    batch = make_fixture(((5, 3), (6, 2)), 4, model.config.vocab_size).batch()
    one = chain_gate.RL_FORM_SAMPLING[:1]
    rep = chain_gate.rl_form_parity(model, batch, SIZE, seed=7, settings=one)["temperature_1"]
    assert rep["sampled_tokens"] == SIZE["prompts"] * SIZE["new_tokens"]
    assert rep["bitwise_equal"] and rep["differing_logprobs"] == 0, rep

    real = rollout.score_completions
    monkeypatch.setattr(rollout, "score_completions",
                        lambda m, c, params, **kw: real(m, c, dataclasses.replace(params, temperature=1.25), **kw))
    bad = chain_gate.rl_form_parity(model, batch, SIZE, seed=7, settings=one)["temperature_1"]
    assert not bad["bitwise_equal"] and bad["differing_logprobs"] > 0
    assert bad["bits_digest"] == rep["bits_digest"]  # the same samples: only the scoring changed
