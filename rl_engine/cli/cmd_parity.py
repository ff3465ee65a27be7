"""``rl-engine parity`` and ``rl-engine parity-report``: train/rollout logprob parity.

``parity`` runs the Qwen3 chain of one backend in both styles (training = packed teacher
forcing, rollout = prefill + KV-cache decode fed the fixture's tokens; temperature as given, no
top-k / top-p) on seeded synthetic weights (presets) or a safetensors checkpoint directory, and
writes ``parity.json`` (schema ``rl_engine.parity/1``) into ``--out``. Exit 0 when the chosen
profile holds over all runs, 1 when it does not, 2 on bad usage or environment.

``parity-report LHS RHS`` computes the WS1 §8 chain metrics of two logprob dumps from any
framework (LHS = training style, RHS = rollout style): ``.pt`` / ``.npy`` 1-D FP32 tensors, or
``.jsonl`` files with one object per token ``{"seq": i, "pos": p, "token_id": t, "logp": x}``
(``pos`` = the position of the scored token). Both sides must cover the same tokens; otherwise
exit 2 naming the first misaligned position. It also prints verl's rollout-correction mismatch
metrics of the two dumps (``rollout_corr/...``, ``training/rollout_probs_diff_*``;
:mod:`rl_engine.rl.metrics`) with LHS as verl's ``old_log_prob`` and RHS as its ``rollout_log_prob``;
a ``.jsonl`` dump is split into sequences by ``seq``, a tensor file is one sequence.
"""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path
from typing import Any

PARITY_SCHEMA = "rl_engine.parity/1"


def register(sub) -> None:
    from rl_engine.cli.args import command

    p = command(sub, "parity", "train/rollout logprob parity of the Qwen3 chain on one backend", [
        "rl-engine parity --out /tmp/p                      # tiny preset, triton_cuda_bf16, strict profile",
        "rl-engine parity --out /tmp/p --profile ws1 --seeds 0 1 2 --baseline",
        "rl-engine parity --out /tmp/p --dump && rl-engine parity-report /tmp/p/logp_train.pt /tmp/p/logp_rollout.pt",
    ])
    p.add_argument("--model", default="tiny",
                   help="preset (tiny, tiny-smoke, qwen3-8b) or a safetensors checkpoint directory (default: tiny)")
    p.add_argument("--backend", default="triton_cuda_bf16",
                   help="reference_fp32, torch_bf16, triton_cuda_bf16 or cuda_bf16 (default: triton_cuda_bf16)")
    p.add_argument("--tokens", type=int, default=None,
                   help="about this many active (completion) tokens per run over 4 sequences "
                        "(default: the model's standard fixture: qwen3-8b -> 1115 tokens, others -> smoke)")
    p.add_argument("--seeds", type=int, nargs="+", default=[0], metavar="SEED",
                   help="one run per seed (weights and fixture), e.g. --seeds 0 1 2 (default: 0)")
    p.add_argument("--logit-scale", type=float, nargs="+", default=[2.0], metavar="STD",
                   help="logit standard deviation of the synthetic lm_head, cycled over the seeds (presets only; default 2.0)")
    p.add_argument("--profile", choices=("ws1", "strict"), default="strict",
                   help="profile that decides the exit code, strict or ws1 (both are computed). Default here: "
                        "strict (our kernels claim bitwise train/rollout parity); parity-report defaults to ws1, "
                        "the standard's thresholds, because it judges dumps from other frameworks")
    p.add_argument("--head", choices=("linear_logp", "lm_head_logp"), default="linear_logp",
                   help="how logprobs are computed: linear_logp (the fused head) or "
                        "lm_head_logp (lm_head then logp) (default: linear_logp)")
    p.add_argument("--temperature", type=float, default=1.0,
                   help="divides the logits on both sides (docs/pitfalls.md P11), e.g. 0.7 (default 1.0)")
    p.add_argument("--no-reference", action="store_true", help="skip the FP32 reference chain (model-level accuracy)")
    p.add_argument("--baseline", action="store_true", help="also run the torch_bf16 chain and report it beside ours")
    p.add_argument("--no-localize", action="store_true", help="do not search the first diverging layer/op on a mismatch")
    p.add_argument("--dump", action="store_true",
                   help="also write logp_train/logp_rollout as .pt and .jsonl (inputs for parity-report)")
    p.add_argument("--out", required=True, metavar="DIR", help="output directory (parity.json), created if missing")
    p.add_argument("--json", action="store_true", help="print the result JSON to stdout")
    p.set_defaults(func=run)

    r = command(sub, "parity-report", "chain metrics (WS1 section 8) of two logprob dumps from any framework", [
        "rl-engine parity-report train_logp.jsonl rollout_logp.jsonl",
        "rl-engine parity-report lhs.pt rhs.pt --key logp --profile strict --json",
    ])
    r.add_argument("lhs", help="training-style logprobs (.pt, .npy, .safetensors or .jsonl)")
    r.add_argument("rhs", help="rollout-style logprobs (.pt, .npy, .safetensors or .jsonl)")
    r.add_argument("--profile", choices=("ws1", "strict"), default="ws1",
                   help="profile that decides the exit code, ws1 or strict (both are computed). Default here: ws1, "
                        "the standard's thresholds for dumps from any framework; rl-engine parity defaults to "
                        "strict because it judges our own kernels, which claim bitwise parity")
    r.add_argument("--key", default=None, help="tensor name inside a multi-tensor .pt file, e.g. --key logp")
    r.add_argument("--json", action="store_true", help="print the metrics as JSON")
    r.set_defaults(func=run_report)


# -- helpers ---------------------------------------------------------------------------------------
def write_json_atomic(path: Path, data: dict[str, Any]) -> None:
    """Write strict JSON (inf/NaN as strings) through a temporary file and ``os.replace``."""
    from rl_engine.jsonio import write_json_atomic as _write

    _write(path, data, prefix=".parity-")


def _strip(obj: Any) -> Any:
    """Drop private keys (tensors) from a result dict."""
    if isinstance(obj, dict):
        return {k: _strip(v) for k, v in obj.items() if not str(k).startswith("_")}
    if isinstance(obj, list):
        return [_strip(v) for v in obj]
    return obj


def _write_jsonl(path: Path, fixtures: list[Any], logp) -> None:
    lines, i, seq0 = [], 0, 0
    for fx in fixtures:
        for b, (tok, p) in enumerate(zip(fx.tokens, fx.prompt_lens)):
            for pos in range(p, int(tok.numel())):
                lines.append(json.dumps({"seq": seq0 + b, "pos": pos, "token_id": int(tok[pos]),
                                         "logp": float(logp[i])}))
                i += 1
        seq0 += len(fx.tokens)
    path.write_text("\n".join(lines) + ("\n" if lines else ""))


# -- parity ------------------------------------------------------------------------------------
def run(args) -> int:
    import torch

    from rl_engine import env

    gpu = torch.cuda.is_available()
    if not gpu and not env.triton_interpret():
        env.enable_triton_interpreter()  # before any kernel module is imported
    from rl_engine import provenance
    from rl_engine.backends.registry import check_backend
    from rl_engine.chain.config import PRESETS, Qwen3Config
    from rl_engine.chain.fixtures import LAYOUTS, make_fixture, scaled_layout
    from rl_engine.chain.gate import chain_kernel_id
    from rl_engine.chain.model import Qwen3Model
    from rl_engine.chain.parity import PROFILES, check_parity, flat_metrics, parity_report, run_styles
    from rl_engine.chain.weights import load_checkpoint, synthetic_weights
    from rl_engine.contract import load_contract
    from rl_engine.errors import RLEngineError
    from rl_engine.gate.compare import chain_metrics

    t0 = time.perf_counter()
    contract = load_contract()
    check_backend(args.backend, contract)
    order = contract.rms_norm_order
    device = torch.device("cuda" if gpu else "cpu")
    if args.tokens is not None and args.tokens < 1:
        raise RLEngineError(f"--tokens must be >= 1, got {args.tokens}")
    checkpoint = None
    if args.model in PRESETS:
        config = PRESETS[args.model]
    else:
        path = Path(args.model)
        if not path.is_dir():
            raise RLEngineError(f"--model {args.model!r}: not a preset ({', '.join(PRESETS)}) and not a directory")
        config = Qwen3Config.from_json(path)
        checkpoint = load_checkpoint(path, config, device=device)
    if args.tokens is not None:
        layout = scaled_layout(args.tokens, long_prompt=3963 if args.model == "qwen3-8b" and args.tokens >= 1000 else None,
                               max_positions=config.max_position_embeddings)
    else:
        layout = LAYOUTS["qwen3-8b" if args.model == "qwen3-8b" else "smoke"]
    if max(p + c for p, c in layout) > config.max_position_embeddings:
        raise RLEngineError(f"the fixture needs {max(p + c for p, c in layout)} positions, more than the "
                            f"model's max_position_embeddings {config.max_position_embeddings}")
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise RLEngineError(f"--out {out} exists and is not a directory")
    try:  # fail before minutes of compute, not after
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise RLEngineError(f"cannot create output folder {out}: {exc.strerror}") from exc
    import os

    if not os.access(out, os.W_OK):
        raise RLEngineError(f"output folder {out} is not writable")
    runs: list[dict[str, Any]] = []
    fixtures = []
    train_all, roll_all = [], []
    kernel_ids: dict[str, str] = {}
    for i, seed in enumerate(args.seeds):
        scale = args.logit_scale[i % len(args.logit_scale)]
        weights = checkpoint if checkpoint is not None else synthetic_weights(config, seed, logit_scale=scale,
                                                                              device=device)
        fixture = make_fixture(layout, seed, config.vocab_size, name="qwen3-8b" if layout == LAYOUTS["qwen3-8b"] else None)
        fixtures.append(fixture)
        ref = None
        if not args.no_reference:
            ref = run_styles(Qwen3Model(weights, "reference_fp32", norm_order=order), fixture.batch(), head=args.head,
                             temperature=args.temperature, rollout=False).train
        model = Qwen3Model(weights, args.backend, norm_order=order)
        rep = check_parity(model, fixture, contract, head=args.head, temperature=args.temperature,
                           reference=ref, localize=not args.no_localize)
        kernel_ids.update(rep["kernel_ids"])
        train_all.append(rep["_logp"]["train"].cpu())
        roll_all.append(rep["_logp"]["rollout"].cpu())
        entry = {"seed": seed, "logit_scale": None if checkpoint is not None else scale, **_strip(rep)}
        if args.baseline:
            base = run_styles(Qwen3Model(weights, "torch_bf16", norm_order=order), fixture.batch(), head=args.head,
                              temperature=args.temperature)
            base_rep = parity_report(base, contract, PROFILES, ref)
            entry["baseline_torch_bf16"] = _strip(base_rep)
        runs.append(entry)
        status = "bitwise equal" if rep["bitwise_equal"] else "DIFFERENT"
        print(f"seed {seed}: {fixture.active_tokens} active tokens, train vs rollout {status}; "
              f"{rep['profiles'][args.profile]['summary']}", file=sys.stderr)
        if args.baseline:
            print(f"  baseline torch_bf16: {base_rep['profiles'][args.profile]['summary']}", file=sys.stderr)
        fd = rep.get("first_divergence")
        if fd:
            print(f"  first divergence: layer {fd['layer']} op {fd['op']} at sequence {fd['token']['seq']} "
                  f"position {fd['token']['pos']} ({fd['differing_tokens']} tokens differ there)", file=sys.stderr)
        del model
    lhs, rhs = torch.cat(train_all), torch.cat(roll_all)
    agg = {p: chain_metrics(lhs, rhs, contract.chain_thresholds(p)) for p in PROFILES}
    passed = agg[args.profile].passed
    result = {
        "schema_version": PARITY_SCHEMA, "kind": "parity", "contract": contract.identity(),
        "provenance": provenance.collect(contract),
        "model": {"name": args.model, "config": config.to_dict(),
                  "weights": checkpoint.provenance if checkpoint is not None else "synthetic, per seed (see runs)"},
        "backend": args.backend, "kernel_id": chain_kernel_id(args.backend, kernel_ids), "kernel_ids": kernel_ids,
        "profile": args.profile, "passed": passed, "head": args.head,
        "sampling": {"temperature": args.temperature, "top_k": None, "top_p": None,
                     "tokens": "fed from the fixture (teacher-forced decode), not sampled"},
        "active_tokens": int(lhs.numel()), "seeds": list(args.seeds),
        "aggregate": {p: {"passed": r.passed, "summary": r.summary(), "metrics": r.metrics,
                          **{k: v for k, v in flat_metrics(r).items() if k != "passed"}} for p, r in agg.items()},
        "runs": runs, "wall_time_s": round(time.perf_counter() - t0, 3),
    }
    write_json_atomic(out / "parity.json", result)
    if args.dump:
        torch.save(lhs, out / "logp_train.pt")
        torch.save(rhs, out / "logp_rollout.pt")
        _write_jsonl(out / "logp_train.jsonl", fixtures, lhs)
        _write_jsonl(out / "logp_rollout.jsonl", fixtures, rhs)
    if args.json:
        print(json.dumps(_strip({"passed": passed, "profile": args.profile, "aggregate": result["aggregate"],
                                 "parity_json": str(out / "parity.json")}), indent=1, default=str))
    else:
        print(agg[args.profile].summary())
        print(f"-> {out / 'parity.json'} ({result['wall_time_s']:.1f} s)")
    return 0 if passed else 1


# -- parity-report -----------------------------------------------------------------------------
def _load_jsonl(path: Path) -> tuple[list[tuple[int, int, int]], list[float]]:
    from rl_engine.errors import InputError

    entries = []
    with path.open() as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                raise InputError(f"{path}:{lineno}: not valid JSON ({exc.msg})") from exc
            if not isinstance(obj, dict):
                raise InputError(f"{path}:{lineno}: expected an object per line")
            for k in ("seq", "pos", "token_id", "logp"):
                if k not in obj:
                    raise InputError(f"{path}:{lineno}: missing field {k!r} (need seq, pos, token_id, logp)")
            for k in ("seq", "pos", "token_id"):
                if isinstance(obj[k], bool) or not isinstance(obj[k], int):
                    raise InputError(f"{path}:{lineno}: {k} must be an integer, got {obj[k]!r}")
            v = obj["logp"]
            if isinstance(v, str) and v in ("nan", "inf", "-inf"):
                v = float(v)
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                raise InputError(f"{path}:{lineno}: logp must be a number, got {obj['logp']!r}")
            entries.append(((obj["seq"], obj["pos"], obj["token_id"]), float(v), lineno))
    entries.sort(key=lambda e: (e[0][0], e[0][1]))
    for a, b in zip(entries, entries[1:]):
        if a[0][:2] == b[0][:2]:
            raise InputError(f"{path}: token seq {a[0][0]} pos {a[0][1]} appears twice (lines {a[2]} and {b[2]})")
    return [e[0] for e in entries], [e[1] for e in entries]


def load_logps(path: str | Path, key: str | None = None):
    """``(logp [N] tensor, coordinates or None)``: coordinates are ``(seq, pos, token_id)`` per
    token for ``.jsonl`` (sorted by seq, pos), ``None`` for tensor files."""
    import torch

    from rl_engine.cli.io import load_tensor
    from rl_engine.errors import InputError

    p = Path(path)
    if p.suffix.lower() == ".jsonl":
        if not p.is_file():
            raise InputError(f"{p}: no such file")
        coords, vals = _load_jsonl(p)
        return torch.tensor(vals, dtype=torch.float64), coords
    if p.suffix.lower() not in (".pt", ".pth", ".npy", ".safetensors"):
        raise InputError(f"{p}: unknown file kind {p.suffix!r}; use .pt, .npy, .safetensors or .jsonl")
    t = load_tensor(p, key)
    if not t.is_floating_point():
        raise InputError(f"{p}: logprobs must be floating point, got {t.dtype}")
    if t.dim() != 1:
        raise InputError(f"{p}: expected a 1-D [N] tensor of logprobs, got shape {list(t.shape)}")
    return t, None


def check_alignment(lhs_name: str, lhs_coords, lhs_n: int, rhs_name: str, rhs_coords, rhs_n: int) -> str:
    """Raise InputError naming the first misaligned token; return how the sides were aligned."""
    from rl_engine.errors import InputError

    if lhs_coords is not None and rhs_coords is not None:
        for i, (a, b) in enumerate(zip(lhs_coords, rhs_coords)):
            if a != b:
                raise InputError(f"sides cover different tokens: first misaligned position is entry {i} (sorted by "
                                 f"seq, pos): {lhs_name} has seq {a[0]} pos {a[1]} token {a[2]}, {rhs_name} has "
                                 f"seq {b[0]} pos {b[1]} token {b[2]}")
        if lhs_n != rhs_n:
            longer, name = (lhs_coords, lhs_name) if lhs_n > rhs_n else (rhs_coords, rhs_name)
            c = longer[min(lhs_n, rhs_n)]
            raise InputError(f"sides cover different tokens: {lhs_name} has {lhs_n}, {rhs_name} has {rhs_n}; first "
                             f"misaligned position is entry {min(lhs_n, rhs_n)}: only {name} has seq {c[0]} pos {c[1]} "
                             f"token {c[2]}")
        return "by (seq, pos, token_id)"
    if lhs_n != rhs_n:
        raise InputError(f"sides cover different tokens: {lhs_name} has {lhs_n} logprobs, {rhs_name} has {rhs_n}; "
                         f"first misaligned position is index {min(lhs_n, rhs_n)}")
    return "by order (a tensor file carries no token coordinates)"


def verl_report(lhs, rhs, coords) -> dict[str, Any]:
    """verl's mismatch metrics (:data:`rl_engine.rl.metrics.VERL_NAMES`) of two aligned dumps [N]:
    ``lhs`` as ``old_log_prob`` (training), ``rhs`` as ``rollout_log_prob``; the tokens grouped into
    sequences by their ``seq`` coordinate (``coords`` from a ``.jsonl``, sorted by seq, pos), or one
    sequence when there are no coordinates. Reporting statistics, no threshold."""
    import torch

    from rl_engine.rl.metrics import VERL_NAMES, mismatch_metrics, pad_rows

    if coords is None:
        sizes, grouping = [int(lhs.numel())], "one sequence (a tensor file carries no seq)"
    else:
        sizes = []
        for i, c in enumerate(coords):
            if i == 0 or c[0] != coords[i - 1][0]:
                sizes.append(0)
            sizes[-1] += 1
        grouping = "by seq"
    old, mask = pad_rows(list(torch.split(lhs.reshape(-1), sizes)))
    roll, _ = pad_rows(list(torch.split(rhs.reshape(-1), sizes)))
    m = mismatch_metrics(old, roll, mask)
    return {"sequences": len(sizes), "grouping": grouping, "old_log_prob": "lhs", "rollout_log_prob": "rhs",
            "metrics": {k: m[k] for k in VERL_NAMES}}


def format_verl(verl: dict[str, Any]) -> str:
    """The text block of :func:`verl_report`."""
    names = verl["metrics"]
    width = max(len(k) for k in names)
    head = (f"verl mismatch metrics (old_log_prob = lhs, rollout_log_prob = rhs; {verl['sequences']} sequence"
            f"{'s' if verl['sequences'] != 1 else ''}, {verl['grouping']}):")
    return "\n".join([head] + [f"  {k.ljust(width)}  {v!r}" for k, v in names.items()])


def run_report(args) -> int:
    import torch

    from rl_engine.contract import load_contract
    from rl_engine.gate.compare import chain_metrics

    contract = load_contract()
    lhs, lc = load_logps(args.lhs, args.key)
    rhs, rc = load_logps(args.rhs, args.key)
    if lhs.numel() == 0 or rhs.numel() == 0:
        from rl_engine.errors import InputError

        raise InputError(f"nothing to compare: {args.lhs} has {lhs.numel()} logprobs, {args.rhs} has {rhs.numel()}")
    aligned = check_alignment(args.lhs, lc, lhs.numel(), args.rhs, rc, rhs.numel())
    notes = []
    for name, t in ((args.lhs, lhs), (args.rhs, rhs)):
        if Path(name).suffix.lower() != ".jsonl" and t.dtype != torch.float32:
            notes.append(f"{name} holds {str(t.dtype).replace('torch.', '')} logprobs; WS1 logprobs are float32")
    reports = {p: chain_metrics(lhs, rhs, contract.chain_thresholds(p)) for p in ("ws1", "strict")}
    chosen = reports[args.profile]
    d = (lhs.double() - rhs.double()).abs()
    worst = int(torch.argmax(torch.nan_to_num(d, nan=math.inf))) if d.numel() else None
    result = {"profile": args.profile, "passed": chosen.passed, "aligned": aligned, "notes": notes,
              "roles": chosen.roles, "active_tokens": chosen.active_tokens,
              "worst_token": None if worst is None else
              {"index": worst, **({"seq": lc[worst][0], "pos": lc[worst][1], "token_id": lc[worst][2]} if lc else {}),
               "lhs": float(lhs[worst]), "rhs": float(rhs[worst])},
              "reports": {p: r.as_dict() for p, r in reports.items()},
              "verl": verl_report(lhs, rhs, lc)}
    if args.json:
        print(json.dumps(result, indent=1, default=str))
    else:
        for p, r in reports.items():
            print(r.summary() + (f"  p99={r.p99_abs_dlogp:.3e} p999={r.p999_abs_dlogp:.3e}" if p == "ws1" else ""))
        print(format_verl(result["verl"]))
        print(f"aligned {aligned}; roles: lhs = {chosen.roles['lhs']}, rhs = {chosen.roles['rhs']}", file=sys.stderr)
        for n in notes:
            print(f"note: {n}", file=sys.stderr)
    return 0 if chosen.passed else 1
