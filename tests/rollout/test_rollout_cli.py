"""``rl-engine generate``: prompt parsing and bad input (exit 2, named, before any model is built)."""

from __future__ import annotations

import pytest

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
                                         ("missing.txt", "no such file"), ("1.5", "no such file")])
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
