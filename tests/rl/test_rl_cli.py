"""``rl-engine rl-step`` (exit 0 / 1 / 2) and ``rl-engine parity-report`` speaking verl's metric names."""

from __future__ import annotations

import json

import pytest
import torch

from rl_engine.cli.main import main
from rl_engine.rl.metrics import VERL_NAMES, mismatch_metrics, pad_rows


def run(capsys, *argv) -> tuple[int, str, str]:
    rc = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory, micro_weights):
    from rl_engine.chain.weights import save_checkpoint

    return save_checkpoint(micro_weights, tmp_path_factory.mktemp("micro") / "ckpt")


@pytest.fixture(scope="module")
def cli_run(checkpoint, tmp_path_factory):
    """One step of 1 prompt x 2 completions x 2 tokens on the micro checkpoint, both controls, dumps on."""
    import io
    from contextlib import redirect_stderr, redirect_stdout

    out = tmp_path_factory.mktemp("rl")
    buf = io.StringIO()
    with redirect_stdout(buf), redirect_stderr(io.StringIO()):
        rc = main(["rl-step", "--model", str(checkpoint), "--steps", "1", "--prompts", "1", "--group", "2",
                   "--max-new-tokens", "2", "--prompt-len", "3", "--control", "torch_bf16,triton_cuda_bf16:torch_bf16",
                   "--out", str(out), "--dump"])
    return rc, buf.getvalue(), out


def test_rl_step_passes_and_writes_rl_step_json(cli_run):
    rc, text, out = cli_run
    assert rc == 0, text
    data = json.loads((out / "rl_step.json").read_text())
    assert data["schema_version"] == "rl_engine.rl_step/1" and data["passed"] is True
    assert data["judgment"].startswith("passed (criterion: the triton_cuda_bf16 path's importance ratio")
    assert data["backend"] == "triton_cuda_bf16" and data["controls"] == ["torch_bf16", "triton_cuda_bf16:torch_bf16"]
    assert data["provenance"]["triton_interpret"] == (not torch.cuda.is_available())
    assert "git_commit" in data["provenance"] and data["settings"]["sampling"]["temperature"] == 1.0
    assert data["settings"]["adv_epsilon"] == 1e-6 and data["settings"]["clip_eps"] == 0.2
    step = data["steps"][0]
    assert step["step"] == 0 and set(step["paths"]) == {"triton_cuda_bf16", "torch_bf16", "triton_cuda_bf16:torch_bf16"}
    ours = step["paths"]["triton_cuda_bf16"]
    assert ours["ratio_min"] == ours["ratio_max"] == 1.0 and ours["rollout_corr/kl"] == 0.0
    assert ours["active_tokens"] == 4
    # the table: one row per path, the ratio printed exactly
    for col in ("reward", "loss", "kl", "k3_kl", "chi2_token", "ratio_min", "ratio_max"):
        assert col in text
    row = next(line for line in text.splitlines() if line.strip().startswith("triton_cuda_bf16 "))
    assert " 1.0 " in row and "4/4" in row
    assert "exactly 1.0 for every token in every step" in text


def test_the_dumps_feed_parity_report_in_verl_terms(cli_run, capsys):
    _, _, out = cli_run
    rc, text, _ = run(capsys, "parity-report", out / "logp_train_step0_triton_cuda_bf16.jsonl",
                      out / "logp_rollout_step0_triton_cuda_bf16.jsonl", "--profile", "strict", "--json")
    data = json.loads(text)
    assert rc == 0 and data["verl"]["sequences"] == 2 and data["verl"]["grouping"] == "by seq"
    assert data["verl"]["metrics"]["rollout_corr/kl"] == 0.0 and data["verl"]["metrics"]["rollout_corr/chi2_seq"] == 0.0
    mixed = "triton_cuda_bf16-to-torch_bf16"
    rc, text, _ = run(capsys, "parity-report", out / f"logp_train_step0_{mixed}.jsonl",
                      out / f"logp_rollout_step0_{mixed}.jsonl", "--profile", "strict")
    assert rc == 1 and "rollout_corr/kl" in text and "training/rollout_probs_diff_max" in text
    step = json.loads((out / "rl_step.json").read_text())["steps"][0]["paths"]["triton_cuda_bf16:torch_bf16"]
    kl_line = next(line for line in text.splitlines() if line.strip().startswith("rollout_corr/kl "))
    assert float(kl_line.split()[-1]) == step["rollout_corr/kl"]  # the same numbers from the dumps


def test_the_command_defaults_are_the_settings_defaults():
    from rl_engine.cli.main import build_parser
    from rl_engine.rl.grpo import RLSettings

    args = build_parser().parse_args(["rl-step", "--out", "x"])
    d = RLSettings()
    for name in ("steps", "group", "max_new_tokens", "temperature", "top_k", "top_p", "seed", "max_batch",
                 "clip_eps", "adv_epsilon", "optimizer", "lr", "weight_decay"):
        assert getattr(args, name) == getattr(d, name), name


def test_a_mismatched_policy_exits_1(capsys, tmp_path, checkpoint):
    """Negative control of the exit code: sample on torch_bf16 (BF16 logits), train on the FP32
    reference chain; the ratio is not 1, the step still finishes, and the command says so."""
    rc, text, _ = run(capsys, "rl-step", "--model", checkpoint, "--backend", "torch_bf16:reference_fp32",
                      "--control", "none", "--steps", "1", "--prompts", "1", "--group", "2", "--max-new-tokens", "2",
                      "--out", tmp_path)
    data = json.loads((tmp_path / "rl_step.json").read_text())
    policy = data["steps"][0]["paths"]["torch_bf16:reference_fp32"]
    assert rc == 1 and data["passed"] is False and "NOT exactly 1" in text
    assert policy["role"] == "policy" and not policy["ratio_exactly_one"] and policy["rollout_corr/kl"] != 0.0
    assert data["controls"] == []  # (whether the update moved any weight depends on PPO clipping here)
    assert data["judgment"].startswith("failed (criterion:")  # the file's verdict agrees with the exit code


@pytest.mark.parametrize("argv,word", [
    (["--group", "1"], "group"),
    (["--steps", "0"], "steps"),
    (["--prompts", "0"], "prompts"),
    (["--max-new-tokens", "0"], "max_new_tokens"),
    (["--clip-eps", "0"], "clip_eps"),
    (["--temperature", "-1"], "temperature"),
    (["--control", "no_such_backend"], "no_such_backend"),
    (["--control", "a:b:c"], "ROLLOUT_BACKEND:TRAIN_BACKEND"),
    (["--control", "triton_cuda_bf16"], "paths must differ"),
    (["--backend", "no_such_backend:torch_bf16"], "no_such_backend"),
    (["--model", "nope-7b"], "not a preset"),
    (["--max-new-tokens", "300"], "max_position_embeddings"),
    (["--prompt-len", "100000000"], "max_position_embeddings"),  # refused by arithmetic, no prompts drawn
    (["--prompt-seed", "-1"], "--prompt-seed"),
    (["--control", "none,torch_bf16"], "cannot be combined"),
    (["--weights-seed", "3"], "presets only"),  # the default model here is a checkpoint
    (["--logit-scale", "3"], "presets only"),
])
def test_bad_input_exits_2_before_any_model(capsys, tmp_path, monkeypatch, checkpoint, argv, word):
    import rl_engine.chain.weights as weights

    def refuse(*a, **k):
        raise AssertionError("a model was built before the input was checked")

    monkeypatch.setattr(weights, "synthetic_weights", refuse)
    monkeypatch.setattr(weights, "load_checkpoint", refuse)
    model = [] if "--model" in argv else ["--model", str(checkpoint)]
    rc, _, err = run(capsys, "rl-step", *model, *argv, "--out", tmp_path / "o")
    assert rc == 2 and word in err, err


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is present: qwen3-8b is allowed there")
def test_qwen3_8b_is_refused_without_a_gpu(capsys, tmp_path):
    rc, _, err = run(capsys, "rl-step", "--model", "qwen3-8b", "--out", tmp_path)
    assert rc == 2 and "too large without a GPU" in err


# -- parity-report: verl's names on a small hand-made pair -------------------------------------------
def _jsonl(path, rows):
    path.write_text("".join(json.dumps(dict(zip(("seq", "pos", "token_id", "logp"), r))) + "\n" for r in rows))


def test_parity_report_prints_verl_metrics_per_sequence(capsys, tmp_path):
    # seq 3: two tokens, seq 7: three (file order does not matter)
    _jsonl(tmp_path / "train.jsonl", [(7, 4, 1, -0.5), (3, 2, 5, -1.0), (3, 3, 6, -2.0), (7, 5, 2, -1.5),
                                      (7, 6, 3, -1.0)])
    _jsonl(tmp_path / "roll.jsonl", [(3, 2, 5, -1.0), (3, 3, 6, -2.5), (7, 4, 1, -0.5), (7, 5, 2, -1.25),
                                     (7, 6, 3, -1.0)])
    rc, text, _ = run(capsys, "parity-report", tmp_path / "train.jsonl", tmp_path / "roll.jsonl", "--json")
    data = json.loads(text)
    assert data["verl"]["sequences"] == 2 and data["verl"]["old_log_prob"] == "lhs"
    assert list(data["verl"]["metrics"]) == list(VERL_NAMES)
    old, mask = pad_rows([torch.tensor([-1.0, -2.0]), torch.tensor([-0.5, -1.5, -1.0])])
    roll, _ = pad_rows([torch.tensor([-1.0, -2.5]), torch.tensor([-0.5, -1.25, -1.0])])
    want = mismatch_metrics(old, roll, mask)
    assert data["verl"]["metrics"] == {k: want[k] for k in VERL_NAMES}
    assert data["verl"]["metrics"]["rollout_corr/log_ppl_diff_min"] == -0.25
    rc, text, _ = run(capsys, "parity-report", tmp_path / "train.jsonl", tmp_path / "roll.jsonl")
    assert "verl mismatch metrics (old_log_prob = lhs, rollout_log_prob = rhs; 2 sequences, by seq)" in text
    for name in VERL_NAMES:
        assert name in text


def test_parity_report_tensor_files_are_one_sequence(capsys, tmp_path):
    a = torch.tensor([-1.0, -2.0, -0.5], dtype=torch.float32)
    torch.save(a, tmp_path / "a.pt")
    torch.save(a.clone(), tmp_path / "b.pt")
    rc, text, _ = run(capsys, "parity-report", tmp_path / "a.pt", tmp_path / "b.pt", "--json")
    verl = json.loads(text)["verl"]
    assert rc == 0 and verl["sequences"] == 1 and verl["grouping"].startswith("one sequence")
    assert verl["metrics"]["rollout_corr/kl"] == 0.0 and verl["metrics"]["rollout_corr/ppl_ratio"] == 1.0
