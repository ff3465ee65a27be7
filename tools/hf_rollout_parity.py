"""Issue #35 evidence: a Hugging Face ``Qwen3ForCausalLM`` patched by
:func:`rl_engine.integrations.transformers.apply` scores the rollout engine's sampled completions with
the engine's own logprob bits; the unpatched model (Hugging Face BF16, sdpa) beside it is the control.

Usage (on a GPU): ``python3 tools/hf_rollout_parity.py --preset qwen3-8b --seeds 0 1 2 --prompts 8
--max-new-tokens 128 --out DIR``. Per seed: synthetic weights (``logit_scale`` 2) copied into a
transformers model built from the preset's ``config.json``; per backend: ``generate`` (temperature 1,
graphs on) on the chain over the model's own parameter storage (``qwen3_weights``), then
``logprobs(patched model, prompt + completion)`` at the completion positions, compared bit for bit
with the rollout's FP32 logprobs; then the same tokens scored by the unpatched model (BF16 logits
upcast, log-softmax in FP32). Writes ``DIR/hf_rollout_parity.json``; exit 0 when every patched
token is bitwise equal, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch


def _hf_model(config, weights):
    import transformers

    hf_cfg = transformers.Qwen3Config(**config.to_hf_dict())
    with torch.device(weights.device):
        model = transformers.Qwen3ForCausalLM(hf_cfg).to(torch.bfloat16)
    missing, unexpected = model.load_state_dict(weights.state_dict(), strict=False)
    if unexpected or [m for m in missing if not m.endswith("rotary_emb.inv_freq")]:
        raise RuntimeError(f"state dict mismatch: missing {missing}, unexpected {unexpected}")
    return model.eval()


def _padded(seqs: list[list[int]], device) -> tuple[torch.Tensor, torch.Tensor]:
    s = max(len(x) for x in seqs)
    ids = torch.zeros((len(seqs), s), dtype=torch.int64)
    mask = torch.zeros((len(seqs), s), dtype=torch.int64)
    for i, x in enumerate(seqs):
        ids[i, : len(x)] = torch.tensor(x)
        mask[i, : len(x)] = 1
    return ids.to(device), mask.to(device)


def _bits(x: torch.Tensor) -> torch.Tensor:
    return x.contiguous().view(torch.int32)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", default="qwen3-8b")
    ap.add_argument("--backends", nargs="+", default=["triton_cuda_bf16", "cuda_bf16"])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    if not torch.cuda.is_available():  # a correctness run of the script itself (tiny presets) in the interpreter
        from rl_engine import env

        env.enable_triton_interpreter()
    from rl_engine.chain.config import get_config
    from rl_engine.chain.model import Qwen3Model
    from rl_engine.chain.weights import synthetic_weights
    from rl_engine.integrations.transformers import apply, logprobs, qwen3_weights
    from rl_engine.provenance import collect as collect_provenance
    from rl_engine.rollout import generate

    config = get_config(args.preset)
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    rows = []
    for seed in args.seeds:
        t0 = time.perf_counter()
        weights = synthetic_weights(config, seed, logit_scale=2.0, device=dev)
        hf = _hf_model(config, weights)
        del weights
        g = torch.Generator().manual_seed(1000 + seed)
        prompts = [torch.randint(0, config.vocab_size, (int(torch.randint(16, 65, (1,), generator=g)),),
                                 generator=g).tolist() for _ in range(args.prompts)]
        built = time.perf_counter() - t0
        for backend in args.backends:
            chain = Qwen3Model(qwen3_weights(hf), backend)
            t1 = time.perf_counter()
            res = generate(chain, prompts, args.max_new_tokens, temperature=1.0, seed=seed,
                           max_batch=args.prompts)
            gen_s = time.perf_counter() - t1
            seqs = [list(c.prompt) + c.tokens.tolist() for c in res.completions]
            ids, mask = _padded(seqs, dev)
            rollout = [c.logprobs for c in res.completions]
            handle = apply(hf, backend)
            with torch.no_grad():
                out = logprobs(hf, ids, attention_mask=mask, head="lm_head_logp", temperature=1.0)
            handle.undo()
            with torch.no_grad():  # the control: Hugging Face's own BF16 forward (sdpa), log-softmax in FP32
                hf_logits = hf(input_ids=ids, attention_mask=mask, use_cache=False).logits.float()
                hf_lp = torch.log_softmax(hf_logits[:, :-1], dim=-1).gather(2, ids[:, 1:, None])[..., 0]
            equal = total = ctrl_equal = 0
            max_abs = ctrl_max = 0.0
            for i, c in enumerate(res.completions):
                p, n = len(c.prompt), int(c.tokens.numel())
                mine = out.logprobs[i, p - 1 : p - 1 + n].cpu()
                ctrl = hf_lp[i, p - 1 : p - 1 + n].cpu()
                ref = rollout[i]
                total += n
                equal += int((_bits(mine) == _bits(ref)).sum())
                ctrl_equal += int((_bits(ctrl) == _bits(ref)).sum())
                max_abs = max(max_abs, float((mine - ref).abs().max()))
                ctrl_max = max(ctrl_max, float((ctrl - ref).abs().max()))
            row = {"seed": seed, "backend": backend, "tokens": total, "bitwise_equal_tokens": equal,
                   "max_abs_dlogp": max_abs, "cuda_graph": res.cuda_graph, "graph_fallback": res.graph_fallback,
                   "control_hf_bf16_sdpa": {"bitwise_equal_tokens": ctrl_equal, "max_abs_dlogp": ctrl_max},
                   "generate_s": round(gen_s, 3), "model_build_s": round(built, 1)}
            rows.append(row)
            print(json.dumps(row), flush=True)
            del chain
        del hf
        torch.cuda.empty_cache()
    ok = all(r["bitwise_equal_tokens"] == r["tokens"] for r in rows)
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "hf_rollout_parity.json").write_text(json.dumps({
        "schema": "rl_engine.hf_rollout_parity/1", "preset": args.preset, "prompts": args.prompts,
        "max_new_tokens": args.max_new_tokens, "sampling": {"temperature": 1.0, "top_k": None, "top_p": None},
        "all_bitwise_equal": ok, "rows": rows, "provenance": collect_provenance()}, indent=1) + "\n")
    print("ALL BITWISE EQUAL" if ok else "MISMATCH", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
