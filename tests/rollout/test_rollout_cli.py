"""``rl-engine generate``: prompt parsing and bad input (exit 2, named, before any model is built)."""

from __future__ import annotations

import json

import pytest
import torch

from rl_engine.cli.cmd_generate import parse_prompts
from rl_engine.cli.main import main
from rl_engine.errors import InputError


def test_inline_and_file_prompts(tmp_path):
    assert parse_prompts("1,2,3;4,5") == [[1, 2, 3], [4, 5]]
    assert parse_prompts("7") == [[7]]
    f = tmp_path / "p.txt"
    f.write_text("1 2 3\n# comment\n\n4,5\n")
    assert parse_prompts(str(f)) == [[1, 2, 3], [4, 5]]


def test_a_non_utf8_prompts_file_is_refused(tmp_path):
    f = tmp_path / "p.txt"
    f.write_bytes(b"1 2 \xff\n")
    with pytest.raises(InputError, match="cannot read"):
        parse_prompts(str(f))


@pytest.mark.parametrize("spec, words", [("1,2;;3", "prompt 1: empty prompt"), ("1,x", "not inline token ids"), ("1,-", "not an integer"),
                                         ("missing.txt", "no such file"), ("1.5", "no such file"),
                                         ("1,,2", "empty token id"), ("1,2,", "empty token id")])
def test_bad_prompts_are_named(spec, words):
    with pytest.raises(InputError, match=words):
        parse_prompts(spec)


@pytest.mark.parametrize("extra, words", [
    (["--prompts", "1,5000"], "outside the vocabulary"),
    (["--prompts", "1,2", "--top-p", "1.5"], "top_p"),
    (["--prompts", "1,2", "--top-k", "0"], "top_k"),
    (["--prompts", "1,2", "--temperature", "-1"], "temperature"),
    (["--prompts", "1,2", "--max-new-tokens", "40960"], "max_position_embeddings"),
    (["--prompts", "1,2", "--max-batch", "0"], "max_batch"),
    (["--prompts", "1,2", "--temperature", "1e-38"], "smallest accepted temperature"),
    (["--prompts", "1,2;3", "--seq-ids", "4", "4"], "distinct"),
    (["--prompts", "1,2;3", "--seq-ids", "4"], "one integer per prompt"),
    (["--prompts", "1,2", "--weights-seed", "-1"], "--weights-seed"),
])
def test_bad_input_exits_2_with_the_reason(capsys, extra, words):
    argv = ["generate", "--model", "tiny-smoke", "--max-new-tokens", "2", *extra]
    if "--max-new-tokens" in extra:
        argv = ["generate", "--model", "tiny-smoke", *extra]
    assert main(argv) == 2
    assert words in capsys.readouterr().err


def test_non_integer_seed_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["generate", "--model", "tiny-smoke", "--prompts", "1", "--max-new-tokens", "1", "--seed", "1.5"])
    assert exc.value.code == 2 and "--seed" in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is for hosts without a GPU")
def test_qwen3_8b_without_a_gpu_is_refused_before_any_weights(capsys, monkeypatch):
    """Issue #36: it used to run for minutes into host memory. Control: the same command on tiny-smoke
    gets past the check and makes its weights (the patched weight maker raises to say so)."""
    from rl_engine.chain import weights

    def made(*args, **kwargs):
        raise AssertionError("synthetic weights were made")

    monkeypatch.setattr(weights, "synthetic_weights", made)
    argv = ["generate", "--prompts", "1,2", "--max-new-tokens", "2", "--model"]
    assert main(argv + ["qwen3-8b"]) == 2
    assert "too large without a GPU" in capsys.readouterr().err
    with pytest.raises(AssertionError, match="synthetic weights were made"):
        main(argv + ["tiny-smoke"])


def test_plain_output_shows_logprobs_and_seq_ids_key_the_draws(capsys):
    """The plain output prints token(logprob) pairs that agree with --json; --seq-ids names the
    sequences, and a sequence run alone under its id draws the same tokens and logprob bits.
    Control: under another id the same prompt draws other noise (its JSON differs)."""
    base = ["generate", "--model", "tiny-smoke", "--max-new-tokens", "3", "--temperature", "1.5", "--seed", "4"]
    assert main(base + ["--prompts", "1,2,3;4,5", "--seq-ids", "70", "90", "--json"]) == 0
    both = {c["seq_id"]: c for c in json.loads(capsys.readouterr().out)["completions"]}
    assert sorted(both) == [70, 90]
    assert main(base + ["--prompts", "1,2,3;4,5", "--seq-ids", "70", "90"]) == 0
    out = capsys.readouterr().out
    for sid, c in both.items():
        line = next(ln for ln in out.splitlines() if ln.startswith(f"seq {sid} "))
        pairs = " ".join(f"{t}({lp:.4f})" for t, lp in zip(c["tokens"], c["logprobs"]))
        assert line.endswith(pairs), (line, pairs)
    assert main(base + ["--prompts", "4,5", "--seq-ids", "90", "--json"]) == 0
    alone = json.loads(capsys.readouterr().out)["completions"][0]
    assert alone["tokens"] == both[90]["tokens"] and alone["logprobs"] == both[90]["logprobs"]
    assert main(base + ["--prompts", "4,5", "--seq-ids", "91", "--json"]) == 0
    other = json.loads(capsys.readouterr().out)["completions"][0]
    assert other["logprobs"] != both[90]["logprobs"]


def test_preset_only_options_are_refused_for_a_checkpoint(capsys, tmp_path):
    """--weights-seed / --logit-scale shape synthetic weights; with a checkpoint they used to be
    ignored silently. Control: the same checkpoint without them gets past the check (a bad prompt
    then names itself)."""
    from rl_engine.chain.config import get_config

    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    get_config("tiny-smoke").write_json(ckpt / "config.json")
    base = ["generate", "--model", str(ckpt), "--max-new-tokens", "2"]
    for extra in (["--weights-seed", "3"], ["--logit-scale", "3"]):
        assert main(base + ["--prompts", "1,2", *extra]) == 2
        assert "presets only" in capsys.readouterr().err
    assert main(base + ["--prompts", "1,x"]) == 2
    assert "not inline token ids" in capsys.readouterr().err
