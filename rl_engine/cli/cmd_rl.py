"""``rl-engine rl-step``: GRPO-style RL steps on the project's kernels, with verl's mismatch metrics.

Runs :class:`rl_engine.rl.grpo.GRPOTrainer` (``docs/rl-step.md``) on a preset with seeded synthetic
weights or a safetensors checkpoint directory: per step, G completions of each prompt sampled with
the rollout engine, a verifiable reward (the fraction of even token ids), group-normalised
advantages, teacher-forcing logprobs with autograd, the PPO clipped loss, backward and one optimizer
step on FP32 master weights. Control paths (``--control``) measure the same step on other backends
without updating. Prints a table per step and writes ``rl_step.json`` (schema
``rl_engine.rl_step/1``) into ``--out``; ``--dump`` also writes each step's and path's two logprob
dumps as ``.jsonl`` for ``rl-engine parity-report``.

Exit 0 when the policy path's importance ratio was exactly 1.0 for every sampled token in every
step (training logprobs equal to the rollout's, bit for bit), 1 otherwise, 2 on bad usage or input
(named before any model is built). Without a GPU the Triton kernels run in the CPU interpreter and
a model above :data:`rl_engine.cli.cmd_generate.CPU_MAX_PARAMETERS` is refused.
"""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path
from typing import Any

RL_STEP_SCHEMA = "rl_engine.rl_step/1"
TABLE_COLUMNS = ("path", "reward", "loss", "kl", "k3_kl", "chi2_token", "ratio_min", "ratio_max", "bitwise/active")


def register(sub) -> None:
    from rl_engine.cli.args import add_list, command

    p = command(sub, "rl-step", "GRPO-style RL steps on the project's kernels with verl's train/rollout mismatch "
                                "metrics (ratio exactly 1 or not)", [
        "rl-engine rl-step --model tiny-smoke --steps 3 --prompts 2 --group 4 --max-new-tokens 4 --out /tmp/rl",
        "rl-engine rl-step --model tiny-smoke --steps 1 --control torch_bf16,triton_cuda_bf16:torch_bf16 "
        "--out /tmp/rl --json --dump",
    ])
    p.add_argument("--model", default="tiny-smoke",
                   help="preset (tiny, tiny-smoke, qwen3-8b; synthetic weights) or a safetensors checkpoint directory "
                        "(default: tiny-smoke)")
    p.add_argument("--steps", type=int, default=3, help="RL steps (>= 1; default 3)")
    p.add_argument("--prompts", type=int, default=2,
                   help="number of prompts N (>= 1; default 2), each --prompt-len token ids drawn uniformly from the "
                        "vocabulary with a CPU generator seeded by --prompt-seed; the same prompts every step")
    p.add_argument("--prompt-len", type=int, default=4, help="tokens per prompt (>= 1; default 4)")
    p.add_argument("--prompt-seed", type=int, default=0, help="seed of the prompts' token ids (default 0)")
    p.add_argument("--group", type=int, default=4, help="completions per prompt G (>= 2; default 4)")
    p.add_argument("--max-new-tokens", type=int, default=4, help="completion length C (>= 1; default 4)")
    p.add_argument("--backend", default="triton_cuda_bf16",
                   help="the policy path: rollout, teacher forcing and update on this backend (default: "
                        "triton_cuda_bf16), or ROLLOUT:TRAIN to sample on one backend and train on another")
    add_list(p, "--control", "PATH", default=None,
             help="control paths measured on the same weights each step, never updated: BACKEND (rollout and "
                  "teacher forcing there, e.g. torch_bf16, the plain PyTorch BF16 path) or ROLLOUT:TRAIN (e.g. "
                  "triton_cuda_bf16:torch_bf16); 'none' for no control (default: torch_bf16)")
    p.add_argument("--temperature", type=float, default=1.0, help="sampling temperature (default 1; 0 = greedy)")
    p.add_argument("--top-k", type=int, default=None, help="keep the k most likely tokens (default: off)")
    p.add_argument("--top-p", type=float, default=None, help="nucleus sampling, p in (0, 1] (default: off)")
    p.add_argument("--seed", type=int, default=0, help="sampling seed, an integer in [0, 2^64) (default 0)")
    p.add_argument("--max-batch", type=int, default=8, help="sequences the rollout engine decodes at once (default 8)")
    p.add_argument("--optimizer", choices=("adamw", "sgd"), default="adamw",
                   help="optimizer on the FP32 master weights (default adamw)")
    p.add_argument("--lr", type=float, default=1e-3, help="learning rate (default 1e-3)")
    p.add_argument("--weight-decay", type=float, default=0.0, help="weight decay (default 0)")
    # the defaults are RLSettings' (tests/rl/test_rl_cli.py checks they agree; the parser stays light to build)
    p.add_argument("--clip-eps", type=float, default=0.2,
                   help="PPO clip: ratio clipped to [1 - e, 1 + e] (default 0.2)")
    p.add_argument("--adv-epsilon", type=float, default=1e-6,
                   help="epsilon of the GRPO advantage (r - mean) / (std + epsilon), an estimator constant "
                        "(default 1e-6)")
    p.add_argument("--weights-seed", type=int, default=None,
                   help="seed of the synthetic weights (presets only; default 0)")
    p.add_argument("--logit-scale", type=float, default=None,
                   help="logit standard deviation of the synthetic lm_head (presets only; default 2)")
    p.add_argument("--out", required=True, metavar="DIR", help="output directory (rl_step.json), created if missing")
    p.add_argument("--dump", action="store_true",
                   help="also write logp_train/logp_rollout .jsonl per step and path (inputs for parity-report)")
    p.add_argument("--json", action="store_true", help="print rl_step.json to stdout instead of the tables")
    p.set_defaults(func=run)


def _num(v: float) -> str:
    if isinstance(v, float) and math.isnan(v):
        return "nan"
    return "0" if v == 0 else f"{v:.3e}"


def format_step(record: dict[str, Any]) -> str:
    """The table of one step (one row per path)."""
    rows = [TABLE_COLUMNS]
    for label, p in record["paths"].items():
        rows.append((label, f"{p['reward_mean']:.4f}", f"{p['loss']:.4g}", _num(p["rollout_corr/kl"]),
                     _num(p["rollout_corr/k3_kl"]), _num(p["rollout_corr/chi2_token"]), repr(p["ratio_min"]),
                     repr(p["ratio_max"]), f"{p['bitwise_equal_tokens']}/{p['active_tokens']}"))
    widths = [max(len(r[i]) for r in rows) for i in range(len(TABLE_COLUMNS))]
    upd = record["update"]
    head = (f"step {record['step']} (seq ids {record['seq_ids'][0]}..{record['seq_ids'][1]}, weights "
            f"{record['weights_digest'][:12]}; update changed {upd['changed_elements']} of {upd['elements']} "
            f"BF16 weights; {record['wall_s']:.1f} s)")
    return "\n".join([head] + ["  " + "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows])


def _safe(label: str) -> str:
    return label.replace(":", "-to-")


def _write_dump(out: Path, step: int, label: str, completions, train_logprobs) -> None:
    from rl_engine.jsonio import strict_json

    for side in ("train", "rollout"):
        lines = []
        for c, tl in zip(completions, train_logprobs):
            vals = tl if side == "train" else c.logprobs
            p = len(c.prompt)
            for j, (t, v) in enumerate(zip(c.tokens.tolist(), vals.tolist())):
                lines.append(json.dumps(strict_json({"seq": c.seq_id, "pos": p + j, "token_id": t, "logp": v})))
        (out / f"logp_{side}_step{step}_{_safe(label)}.jsonl").write_text("\n".join(lines) + "\n")


def run(args) -> int:
    import torch

    from rl_engine import env

    gpu = torch.cuda.is_available()
    if not gpu and not env.triton_interpret():
        env.enable_triton_interpreter()  # before any kernel module is imported
    from rl_engine import provenance
    from rl_engine.backends.registry import check_backend
    from rl_engine.chain.weights import load_checkpoint, synthetic_weights
    from rl_engine.cli.cmd_generate import model_config
    from rl_engine.contract import load_contract
    from rl_engine.errors import InputError, RLEngineError
    from rl_engine.jsonio import write_json_atomic
    from rl_engine.rl.grpo import GRPOTrainer, PathSpec, RLSettings, check_run, make_prompts

    t0 = time.perf_counter()
    device = torch.device("cuda" if gpu else "cpu")
    # -- every input checked before a model is built -------------------------------------------------
    settings = RLSettings(steps=args.steps, group=args.group, max_new_tokens=args.max_new_tokens,
                          temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, seed=args.seed,
                          max_batch=args.max_batch, clip_eps=args.clip_eps, adv_epsilon=args.adv_epsilon,
                          optimizer=args.optimizer, lr=args.lr, weight_decay=args.weight_decay)
    config, path = model_config(args.model, gpu, args.weights_seed, args.logit_scale)
    if args.prompt_seed < 0:
        raise InputError(f"--prompt-seed: expected an integer >= 0, got {args.prompt_seed}")
    if isinstance(args.prompt_len, int) and args.prompt_len + args.max_new_tokens > config.max_position_embeddings:
        raise InputError(f"--prompt-len {args.prompt_len} + --max-new-tokens {args.max_new_tokens} exceed the model's "
                         f"max_position_embeddings {config.max_position_embeddings}")
    prompts = make_prompts(args.prompts, args.prompt_len, config.vocab_size, args.prompt_seed)
    check_run(config, prompts, settings)
    policy = PathSpec.parse(args.backend)
    controls_arg = ["torch_bf16"] if args.control is None else args.control
    if "none" in controls_arg and len(controls_arg) > 1:
        raise InputError(f"--control: 'none' means no control path and cannot be combined with others "
                         f"({', '.join(controls_arg)})")
    controls = [] if controls_arg == ["none"] else [PathSpec.parse(c) for c in controls_arg]
    labels = [policy.label] + [c.label for c in controls]
    if len(set(labels)) != len(labels):
        raise InputError(f"--control: paths must differ from each other and from --backend {policy.label}")
    contract = load_contract()
    for name in dict.fromkeys(b for c in [policy, *controls] for b in (c.rollout, c.train)):
        check_backend(name, contract)
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise RLEngineError(f"--out {out} exists and is not a directory")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise RLEngineError(f"cannot create output folder {out}: {exc.strerror}") from exc
    # -- the run -----------------------------------------------------------------------------------
    weights = (load_checkpoint(path, config, device=device) if path is not None
               else synthetic_weights(config, args.weights_seed or 0,
                                      logit_scale=2.0 if args.logit_scale is None else args.logit_scale, device=device))
    trainer = GRPOTrainer(weights, prompts, settings, backend=policy, controls=controls,
                          norm_order=contract.rms_norm_order)
    interpreted = env.triton_interpret() and not gpu
    result: dict[str, Any] = {
        "schema_version": RL_STEP_SCHEMA, "kind": "rl_step",
        "judgment": f"pending (criterion: the {policy.label} path's importance ratio exp(train_lp - rollout_lp) is "
                    "exactly 1.0 for every sampled token in every step)",
        "passed": None, "contract": contract.identity(), "provenance": provenance.collect(contract),
        "model": {"name": args.model, "config": config.to_dict(), "weights": weights.provenance},
        "backend": policy.label, "controls": [c.label for c in controls], "device": str(device),
        "triton_interpreter": interpreted, "settings": settings.to_dict(), "prompts": prompts, "steps": [],
    }
    del weights
    passed = True
    for k in range(settings.steps):
        res = trainer.step()
        result["steps"].append(res.record)
        passed = passed and res.record["paths"][trainer.policy_path.label]["ratio_exactly_one"]
        if args.dump:
            for label, pr in res.paths.items():
                _write_dump(out, k, label, pr.completions, pr.train_logprobs)
        if not args.json:
            print(format_step(res.record))
            sys.stdout.flush()
        print(f"rl-step: step {k} done in {res.record['wall_s']:.1f} s", file=sys.stderr)
    result["passed"] = passed
    result["judgment"] = result["judgment"].replace("pending", "passed" if passed else "failed", 1)
    result["wall_time_s"] = round(time.perf_counter() - t0, 3)
    write_json_atomic(out / "rl_step.json", result, prefix=".rl_step-")
    if args.json:
        from rl_engine.jsonio import strict_json

        print(json.dumps(strict_json(result), indent=1))
    else:
        verdict = "exactly 1.0 for every token in every step" if passed else "NOT exactly 1 (see rl_step.json)"
        print(f"{policy.label} importance ratio: {verdict}; -> {out / 'rl_step.json'} ({result['wall_time_s']:.1f} s)")
    return 0 if passed else 1
