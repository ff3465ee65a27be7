"""``rl-engine generate``: sample completions with the rollout engine and print tokens/s.

Runs :func:`rl_engine.rollout.generate` (continuous batching, batch-invariant sampling;
``docs/rollout.md``) on a preset with seeded synthetic weights or a safetensors checkpoint
directory. Without a GPU the Triton kernels run in the CPU interpreter, and the tokens/s printed
are the interpreter's (a correctness path, not a speed figure); a model above
:data:`CPU_MAX_PARAMETERS` is refused there, as ``rl-engine gate`` refuses the qwen3-8b workload.
Prints each sequence's tokens with their FP32 logprobs (``--json``: full precision). Exit 0 on
success, 2 on bad usage or input (named before any model is built).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

CPU_MAX_PARAMETERS = 1_000_000_000
"""Without a GPU, ``generate`` refuses a model with more parameters than this (the qwen3-8b preset has
8.2e9; the CPU presets tiny and tiny-smoke 7.9e7 and 3.7e6): its BF16 weights alone would take 2
bytes each of host memory and every decode step minutes of interpreted kernels."""

PROMPTS_HELP = ("prompts as token ids: a file with one prompt per line, ids separated by spaces or commas "
                "(blank lines and lines starting with # are skipped), or inline, ids separated by commas "
                "and prompts by semicolons, e.g. '1,2,3;4,5'")


def register(sub) -> None:
    from rl_engine.cli.args import command

    p = command(sub, "generate", "sample completions with the rollout engine (continuous batching) and print tokens/s",
                ["rl-engine generate --model tiny-smoke --prompts '1,2,3;4,5' --max-new-tokens 4",
                 "rl-engine generate --model tiny-smoke --prompts prompts.txt --max-new-tokens 8 --top-p 0.9 --json"])
    p.add_argument("--model", required=True,
                   help="preset (tiny, tiny-smoke, qwen3-8b; synthetic weights) or a safetensors checkpoint directory")
    p.add_argument("--prompts", required=True, help=PROMPTS_HELP)
    p.add_argument("--max-new-tokens", type=int, required=True, help="token budget per prompt (>= 1)")
    p.add_argument("--temperature", type=float, default=1.0, help="0 = greedy (lowest id on ties); default 1")
    p.add_argument("--top-k", type=int, default=None, help="keep the k most likely tokens (ties: lower id)")
    p.add_argument("--top-p", type=float, default=None, help="nucleus: smallest prefix with mass >= p, p in (0, 1]")
    p.add_argument("--seed", type=int, default=0, help="sampling seed, an integer in [0, 2^64) (default 0)")
    p.add_argument("--seq-ids", type=int, nargs="+", default=None,
                   help="one sequence id per prompt, distinct, in [0, 2^63): they key the sampling noise, so a "
                        "sequence is reproduced in any batch by its id (default: 0 .. N-1, the prompt's index)")
    p.add_argument("--max-batch", type=int, default=8,
                   help="sequences decoded at once (default 8; the engine runs min(max_batch, prompts) slots); "
                        "more wait in a queue")
    p.add_argument("--stop-token-ids", type=int, nargs="*", default=None, help="token ids that end a sequence")
    p.add_argument("--backend", default="triton_cuda_bf16", help="kernel backend (default: triton_cuda_bf16)")
    p.add_argument("--weights-seed", type=int, default=None, help="seed of the synthetic weights (presets only)")
    p.add_argument("--logit-scale", type=float, default=None,
                   help="logit standard deviation of the synthetic lm_head (presets only; default 2)")
    p.add_argument("--json", action="store_true",
                   help="print the result as JSON (logprobs at full FP32 precision; plain output rounds them to 4 decimals)")
    p.set_defaults(func=run)


def _parse_ids(text: str, where: str) -> list[int]:
    from rl_engine.errors import InputError

    if any(not chunk.strip() for chunk in text.split(",")) and text.strip():
        raise InputError(f"{where}: an empty token id between commas in {text.strip()!r}")
    parts = [t for t in text.replace(",", " ").split()]
    if not parts:
        raise InputError(f"{where}: empty prompt")
    ids = []
    for t in parts:
        try:
            ids.append(int(t))
        except ValueError:
            raise InputError(f"{where}: {t!r} is not an integer token id") from None
    return ids


def parse_prompts(spec: str) -> list[list[int]]:
    """Prompts from ``--prompts`` (see :data:`PROMPTS_HELP`): a file path, else the inline form.

    Raises InputError for an empty prompt or a non-integer id, naming the line or prompt.
    """
    from rl_engine.errors import InputError

    path = Path(spec)
    if path.is_file():
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise InputError(f"{path}: cannot read the prompts file ({exc})") from exc
        prompts = []
        for n, line in enumerate(text.splitlines(), 1):
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            prompts.append(_parse_ids(line, f"{path} line {n}"))
        if not prompts:
            raise InputError(f"{path}: no prompts")
        return prompts
    if set(spec) - set("0123456789,; \t-+"):
        raise InputError(f"--prompts {spec!r}: no such file, and not inline token ids like '1,2,3;4,5'")
    return [_parse_ids(chunk, f"--prompts prompt {i}") for i, chunk in enumerate(spec.split(";"))]


def model_config(spec: str, gpu: bool, weights_seed: int | None = None, logit_scale: float | None = None):
    """``(config, checkpoint path or None)`` of ``--model`` (a preset or a safetensors checkpoint
    directory holding ``config.json``), refused before any weights are made when it has more than
    :data:`CPU_MAX_PARAMETERS` and there is no GPU. ``weights_seed`` / ``logit_scale``: the
    synthetic-weight options as given (None when not given), checked here for every command.

    Raises RLEngineError (not a preset, not a directory), ConfigError (the directory's config.json),
    InputError (too large without a GPU; a synthetic-weight option with a checkpoint; a negative
    ``weights_seed``)."""
    from rl_engine.chain.config import PRESETS, Qwen3Config
    from rl_engine.errors import InputError, RLEngineError

    if spec in PRESETS:
        config, path = PRESETS[spec], None
    else:
        path = Path(spec)
        if not path.is_dir():
            raise RLEngineError(f"--model {spec!r}: not a preset ({', '.join(PRESETS)}) and not a directory")
        config = Qwen3Config.from_json(path)
    if not gpu and config.num_parameters() > CPU_MAX_PARAMETERS:
        raise InputError(f"--model {spec}: {config.num_parameters():.3g} parameters is too large without a GPU "
                         f"(at most {CPU_MAX_PARAMETERS:.0e} here: the kernels would run in the CPU interpreter, "
                         "minutes per decode step); run it on a CUDA GPU or pick the tiny or tiny-smoke preset")
    if path is not None and (weights_seed is not None or logit_scale is not None):
        raise InputError(f"--weights-seed and --logit-scale shape synthetic weights (presets only); --model {spec} "
                         "is a checkpoint")
    if weights_seed is not None and weights_seed < 0:
        raise InputError(f"--weights-seed: expected an integer >= 0, got {weights_seed}")
    return config, path


def run(args) -> int:
    import torch

    from rl_engine import env

    gpu = torch.cuda.is_available()
    if not gpu and not env.triton_interpret():
        env.enable_triton_interpreter()  # before any kernel module is imported
    from rl_engine.backends.registry import check_backend
    from rl_engine.chain.model import Qwen3Model
    from rl_engine.chain.weights import load_checkpoint, synthetic_weights
    from rl_engine.contract import load_contract
    from rl_engine.rollout import generate
    from rl_engine.rollout.engine import plan_generation

    device = torch.device("cuda" if gpu else "cpu")
    config, path = model_config(args.model, gpu, args.weights_seed, args.logit_scale)
    prompts = parse_prompts(args.prompts)
    settings = dict(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, seed=args.seed,
                    stop_token_ids=args.stop_token_ids, max_batch=args.max_batch, seq_ids=args.seq_ids)
    plan_generation(config, prompts, args.max_new_tokens, **settings)  # every input error before the model
    contract = load_contract()
    check_backend(args.backend, contract)
    weights = (load_checkpoint(path, config, device=device) if path is not None
               else synthetic_weights(config, args.weights_seed or 0,
                                      logit_scale=2.0 if args.logit_scale is None else args.logit_scale, device=device))
    model = Qwen3Model(weights, args.backend, norm_order=contract.rms_norm_order)
    res = generate(model, prompts, args.max_new_tokens, **settings)
    interpreted = env.triton_interpret() and args.backend == "triton_cuda_bf16"
    where = "Triton CPU interpreter" if interpreted else str(device)
    if args.json:
        print(json.dumps({
            "model": args.model, "backend": args.backend, "device": str(device), "triton_interpreter": interpreted,
            "sampling": res.sampling.to_dict(), "stop_token_ids": list(args.stop_token_ids or []),
            "max_batch": res.max_batch, "s_max": res.s_max, "decode_steps": res.decode_steps,
            "prefills": res.prefills, "cuda_graph": res.cuda_graph, "graph_fallback": res.graph_fallback,
            "generated_tokens": res.generated_tokens, "wall_s": round(res.wall_s, 4),
            "tokens_per_s": round(res.tokens_per_s, 4),
            "completions": [{"seq_id": c.seq_id, "prompt_len": len(c.prompt), "tokens": c.tokens.tolist(),
                             "logprobs": c.logprobs.tolist(), "finish_reason": c.finish_reason}
                            for c in res.completions],
        }, indent=1))
    else:
        print("token(logprob) per drawn token; logprobs under the sampling distribution, FP32 rounded to 4 decimals")
        for c in res.completions:
            print(f"seq {c.seq_id} ({len(c.prompt)} prompt tokens, {c.finish_reason}): "
                  + " ".join(f"{t}({lp:.4f})" for t, lp in zip(c.tokens.tolist(), c.logprobs.tolist())))
        print(f"{res.generated_tokens} tokens in {res.wall_s:.2f} s: {res.tokens_per_s:.3f} tokens/s "
              f"({where}, max_batch {res.max_batch}, {res.decode_steps} decode steps, {res.prefills} prefills"
              f"{', CUDA graphs' if res.cuda_graph else ''})")
        if res.graph_fallback:
            print(f"note: the decode steps ran eagerly, the CUDA graph capture failed: {res.graph_fallback}",
                  file=sys.stderr)
    sys.stdout.flush()
    return 0
