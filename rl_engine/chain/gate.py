"""The gate's chain-parity cell (WS1 §8, docs/decisions.md 10 and 15).

``chain_parity_cell(backend, workload, contract, seed)`` runs, for each (seed, logit scale) of
the workload's plan, on seeded synthetic weights and a seeded token fixture:

* the candidate backend in both styles (training = packed teacher forcing, rollout = prefill +
  KV-cache decode), with the linear_logp head and temperature 1 (no top-k / top-p);
* the ``torch_bf16`` chain in both styles (the baseline printed beside ours);
* the ``reference_fp32`` chain in training style (the FP32 gold for model-level accuracy).

Status is ``green`` iff the strict profile holds (every active token's logprob bitwise equal in
both styles, the project's target) AND the ws1 gate metrics hold, over all runs together, AND the
RL form holds (:func:`rl_form_parity`: completions sampled by the rollout engine, temperature 1 and
top-p 0.9, scored again by teacher forcing: every sampled token's logprob bitwise equal); the
reason says which failed. On a mismatch the first divergence (token, layer, op) is localised.

Workloads: ``smoke`` runs the ``tiny-smoke`` model (the tiny Qwen3 of docs/pitfalls.md P1 with a 5000-token
vocabulary, so the Triton CPU interpreter finishes in well under a minute) on the ``smoke``
fixture; ``qwen3-8b`` runs the Qwen3-8B architecture on the ``qwen3-8b`` fixture (1115 active
tokens in 8 sequences per run, one sequence beyond 4096 positions), three seeds with logit scales
1, 4 and 10.
"""

from __future__ import annotations

import hashlib
import inspect
import time
from pathlib import Path
from typing import Any

import torch

from rl_engine.chain.config import get_config
from rl_engine.chain.fixtures import make_fixture
from rl_engine.chain.model import Qwen3Model
from rl_engine.chain.parity import (PROFILES, abs_stats, flat_metrics, localize_first_divergence, parity_report,
                                    run_styles)
from rl_engine.chain.scoring import SAMPLING
from rl_engine.chain.weights import synthetic_weights
from rl_engine.contract import Contract
from rl_engine.errors import RLEngineError
from rl_engine.gate.compare import chain_metrics
from rl_engine.gate.digest import BitsDigest

GREEN, RED = "green", "red"
BASELINE = "torch_bf16"
REFERENCE = "reference_fp32"
HEAD = "linear_logp"

PLANS: dict[str, dict[str, Any]] = {
    "smoke": {"model": "tiny-smoke", "fixture": "smoke", "runs": ((0, 2.0),),
              "rl_form": {"prompts": 1, "prompt_len": 4, "new_tokens": 2}},
    "qwen3-8b": {"model": "qwen3-8b", "fixture": "qwen3-8b", "runs": ((0, 1.0), (1, 4.0), (2, 10.0)),
                 "rl_form": {"prompts": 8, "prompt_len": 32, "new_tokens": 32}},
}
"""Workload -> model preset, fixture layout, (seed offset, logit scale) of each run, and the size of
the RL form of parity (run on the first run's weights)."""

RL_FORM_SAMPLING = (("temperature_1", {"temperature": 1.0}), ("top_p_0.9", {"temperature": 1.0, "top_p": 0.9}))
"""The sampling settings of the RL form of chain parity (issue #19): plain temperature-1 sampling and
nucleus sampling."""


def rl_form_parity(model: Qwen3Model, fixture_batch: Any, size: dict[str, int], seed: int,
                   settings: tuple[tuple[str, dict[str, Any]], ...] = RL_FORM_SAMPLING) -> dict[str, Any]:
    """The RL form of train/rollout parity: :func:`rl_engine.rollout.generate` samples completions of
    prompts taken from the fixture's sequences (their first ``prompt_len`` tokens), then teacher
    forcing (:func:`rl_engine.rollout.score_completions`) scores those same tokens under the same
    sampling distribution; per setting of :data:`RL_FORM_SAMPLING`, ``bitwise_equal`` says whether
    every sampled token's two FP32 logprobs are the same bits. Returns the per-setting report
    (``settings``: a subset of :data:`RL_FORM_SAMPLING`, for tests)."""
    from rl_engine.rollout import generate, score_completions

    prompts = [t[: size["prompt_len"]].tolist() for t in fixture_batch.tokens[: size["prompts"]]]
    out: dict[str, Any] = {}
    for name, kw in settings:
        t0 = time.perf_counter()
        res = generate(model, prompts, size["new_tokens"], seed=seed, max_batch=len(prompts), **kw)
        scored = score_completions(model, res.completions, res.sampling)
        tokens = sum(int(c.tokens.numel()) for c in res.completions)
        diff = sum(int((c.logprobs.view(torch.int32) != s.view(torch.int32)).sum())
                   for c, s in zip(res.completions, scored))
        digest = BitsDigest()
        for c in res.completions:
            digest.add_all(((f"seq{c.seq_id}_tokens", c.tokens), (f"seq{c.seq_id}_logprobs", c.logprobs)))
        out[name] = {"sampling": dict(kw, seed=seed), "sequences": len(prompts), "sampled_tokens": tokens,
                     "differing_logprobs": diff, "bitwise_equal": diff == 0, "bits_digest": digest.hexdigest(),
                     "seconds": round(time.perf_counter() - t0, 3)}
    return out


_SHARED_RUNS: dict[tuple[Any, ...], tuple[Any, Any]] = {}
"""Reference and baseline results per (model, fixture, seed, logit scale, device): per-token
logprobs only, reused by the next backend's chain cell in the same process instead of recomputed."""
_SHARED_RUNS_MAX = 16


def _device(workload: str) -> torch.device:
    if torch.cuda.is_available():
        return torch.device("cuda")
    if workload != "smoke":
        raise RLEngineError(f"the {workload} chain needs a CUDA GPU (none on this machine); use workload smoke")
    return torch.device("cpu")


def _plan_of(workload: Any) -> tuple[str, dict[str, Any], torch.device, Any]:
    """``(name, chain plan, device, model config)`` of a workload (or its name); RLEngineError for
    a workload without a chain plan."""
    wname = getattr(workload, "name", workload)
    if wname not in PLANS:
        raise RLEngineError(f"no chain plan for workload {wname!r}; known: {', '.join(PLANS)}")
    plan = PLANS[wname]
    return wname, plan, _device(wname), get_config(plan["model"])


def chain_kernel_id(backend: str, kernel_ids: dict[str, str]) -> str:
    """``chain/<backend>/qwen3_dense@<hash>``: hash of the chain sources and every op's kernel id."""
    h = hashlib.sha256()
    here = Path(inspect.getsourcefile(Qwen3Model) or "")
    for name in ("model.py", "scoring.py", "parity.py", "gate.py"):
        p = here.parent / name
        if p.is_file():
            h.update(p.read_bytes())
    for k in sorted(kernel_ids):
        h.update(f"{k}={kernel_ids[k]}".encode())
    return f"chain/{backend}/qwen3_dense@{h.hexdigest()[:12]}"


def chain_parity_cell(backend: str, workload: Any, contract: Contract, seed: int, *,
                      rl_form: bool = True) -> tuple[str, str, dict[str, Any], str | None]:
    """One chain-parity cell: ``(status, reason, details, kernel_id)`` (see the module docstring).

    ``workload`` is a :class:`rl_engine.ops.spec.Workload` (or its name). ``rl_form=False`` leaves
    the RL form out (tests whose subject is another part of the cell; the gate always runs it).
    """
    wname, plan, device, config = _plan_of(workload)
    t_start = time.perf_counter()
    ours_train, ours_roll, base_train, base_roll, refs = [], [], [], [], []
    per_run: list[dict[str, Any]] = []
    fixtures: list[dict[str, Any]] = []
    first_div = None
    rl_report: dict[str, Any] | None = None
    kernel_ids: dict[str, str] = {}
    weights_prov = []
    for offset, scale in plan["runs"]:
        run_seed = int(seed) + int(offset)
        weights = synthetic_weights(config, run_seed, logit_scale=scale, device=device)
        fixture = make_fixture(plan["fixture"], run_seed, config.vocab_size)
        batch = fixture.batch()
        fixtures.append(fixture.describe())
        weights_prov.append({k: v for k, v in weights.provenance.items() if k != "recipe"})
        key = (plan["model"], plan["fixture"], run_seed, scale, str(device))
        reused = key in _SHARED_RUNS
        if not reused:  # the gold and the baseline do not depend on the judged backend
            ref_model = Qwen3Model(weights, REFERENCE, norm_order=contract.rms_norm_order)
            ref = run_styles(ref_model, batch, head=HEAD, rollout=False)
            del ref_model
            _free(device)
            base_model = Qwen3Model(weights, BASELINE, norm_order=contract.rms_norm_order)
            base = run_styles(base_model, batch, head=HEAD)
            del base_model
            if len(_SHARED_RUNS) >= _SHARED_RUNS_MAX:
                _SHARED_RUNS.clear()
            _SHARED_RUNS[key] = (ref, base)
        ref, base = _SHARED_RUNS[key]
        model = Qwen3Model(weights, backend, norm_order=contract.rms_norm_order)
        ours = run_styles(model, batch, head=HEAD)
        _remember_styles((*key, contract.rms_norm_order), backend, ours)
        kernel_ids.update(ours.kernel_ids)
        if rl_form and rl_report is None:  # on the first run's weights: generate, then teacher-force the samples
            rl_report = {"seed": run_seed, "logit_scale": scale,
                         **rl_form_parity(model, batch, plan["rl_form"], run_seed)}
        rep = parity_report(ours, contract, PROFILES, ref.train)
        brep = parity_report(base, contract, ("ws1",), ref.train)
        bitwise = bool(torch.equal(ours.train.view(torch.int32), ours.rollout.view(torch.int32)))
        if not bitwise and first_div is None:
            first_div = localize_first_divergence(model, batch, head=HEAD)
            if first_div is not None:
                first_div = {"seed": run_seed, "logit_scale": scale, **first_div}
        per_run.append({"seed": run_seed, "logit_scale": scale, "fixture_hash": fixture.hash(),
                        "active_tokens": fixture.active_tokens, "bitwise_equal": bitwise,
                        "ours": {p: _short(rep["profiles"][p]) for p in PROFILES},
                        "ours_vs_reference": rep.get("vs_reference"),
                        "baseline_torch_bf16": _short(brep["profiles"]["ws1"]),
                        "baseline_vs_reference": brep.get("vs_reference"),
                        "seconds": {"reference": ref.seconds, "baseline": base.seconds, "ours": ours.seconds},
                        "reference_and_baseline": "reused from an earlier cell in this process" if reused else "computed"})
        ours_train.append(ours.train.cpu())
        ours_roll.append(ours.rollout.cpu())
        base_train.append(base.train.cpu())
        base_roll.append(base.rollout.cpu())
        refs.append(ref.train.cpu())
        del model, weights
        _free(device)
    lhs, rhs = torch.cat(ours_train), torch.cat(ours_roll)
    digest = BitsDigest()
    digest.add_all((("teacher_forcing_logprobs", lhs), ("rollout_logprobs", rhs)))
    reports = {p: chain_metrics(lhs, rhs, contract.chain_thresholds(p)) for p in PROFILES}
    base_rep = chain_metrics(torch.cat(base_train), torch.cat(base_roll), contract.chain_thresholds("ws1"))
    ref_all = torch.cat(refs)
    strict, ws1 = reports["strict"], reports["ws1"]
    flat = flat_metrics(ws1)
    combined_hash = hashlib.sha256("".join(f["fixture_hash"] for f in fixtures).encode()).hexdigest()
    details: dict[str, Any] = {
        "profile": "strict",
        "profiles_checked": list(PROFILES),
        "active_tokens": int(lhs.numel()),
        "seeds": [r["seed"] for r in per_run],
        "logit_scales": [r["logit_scale"] for r in per_run],
        "fixture_hash": combined_hash,
        "fixture_hash_rule": "sha256 of the concatenated per-run fixture hashes (each: sha256 of seed, V, "
                             "lengths and token ids)",
        "fixtures": fixtures,
        **{k: flat[k] for k in ("max_abs_dlogp", "mean_abs_dlogp", "approx_kl0", "clipfrac0",
                                "p99_abs_dlogp", "p999_abs_dlogp", "bitwise_equal_tokens")},
        "metrics": {**ws1.metrics, **{"strict_dlogp_zero": strict.metrics["strict_dlogp_zero"]}},
        "ws1": {"passed": ws1.passed, "summary": ws1.summary()},
        "strict": {"passed": strict.passed, "summary": strict.summary(),
                   "differing_tokens": strict.active_tokens - strict.bitwise_equal_tokens,
                   "first_nonzero_token": strict.first_nonzero_token},
        "baseline_torch_bf16": {**{k: v for k, v in flat_metrics(base_rep).items()},
                                "vs_reference": {"train": abs_stats(torch.cat(base_train), ref_all),
                                                 "rollout": abs_stats(torch.cat(base_roll), ref_all)}},
        "vs_reference": {"train": abs_stats(lhs, ref_all), "rollout": abs_stats(rhs, ref_all),
                         "reference": "reference_fp32 chain, training style, FP32 on the upcast weights"},
        "first_divergence": first_div,
        "rl_form": rl_report,
        "per_run": per_run,
        "model": {"preset": plan["model"], "config": config.to_dict(), "weights": weights_prov,
                  "device": str(device)},
        "head": HEAD,
        "sampling": dict(SAMPLING),
        "roles": dict(ws1.roles),
        "kernel_ids": kernel_ids,
        "bits_digest": digest.hexdigest(),
        "wall_time_s": round(time.perf_counter() - t_start, 3),
    }
    problems = []
    if not strict.passed:
        where = ""
        if first_div:
            where = (f"; first divergence at layer {first_div['layer']} op {first_div['op']}, "
                     f"sequence {first_div['token']['seq']} position {first_div['token']['pos']} (seed {first_div['seed']})")
        problems.append(f"strict profile failed: {strict.active_tokens - strict.bitwise_equal_tokens}/"
                        f"{strict.active_tokens} active tokens differ between teacher forcing and decode{where}")
    if not ws1.passed:
        bad = [f"{k} {m['value']:.3e} > {m['threshold']:g}" for k, m in ws1.metrics.items()
               if m["decision"] == "gate" and not m["passed"]]
        problems.append("ws1 gate metrics failed: " + ", ".join(bad))
    for name, r in ((n, v) for n, v in (rl_report or {}).items() if isinstance(v, dict)):
        if not r["bitwise_equal"]:
            problems.append(f"RL form ({name}): {r['differing_logprobs']}/{r['sampled_tokens']} sampled tokens' "
                            f"logprobs differ between generation and teacher forcing")
    status = GREEN if not problems else RED
    rl_tokens = sum(v["sampled_tokens"] for v in (rl_report or {}).values() if isinstance(v, dict))
    rl_note = (f"; RL form: all {rl_tokens} sampled tokens' logprobs bitwise equal (generate vs teacher forcing)"
               if rl_report else "; RL form not run")
    reason = "; ".join(problems) if problems else (
        f"strict: all {strict.active_tokens} active tokens bitwise equal (train vs rollout); ws1 metrics hold"
        + rl_note)
    return status, reason, details, chain_kernel_id(backend, kernel_ids)


def _short(profile_report: dict[str, Any]) -> dict[str, Any]:
    keep = ("passed", "max_abs_dlogp", "mean_abs_dlogp", "approx_kl0", "clipfrac0", "p99_abs_dlogp",
            "p999_abs_dlogp", "bitwise_equal_tokens", "active_tokens", "first_nonzero_token")
    return {k: profile_report[k] for k in keep if k in profile_report}


def _free(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.empty_cache()


_BACKEND_RUNS: dict[tuple[Any, ...], tuple[torch.Tensor, torch.Tensor, dict[str, str]]] = {}
"""Each built-in backend's teacher-forcing and rollout logprobs (on the CPU) per chain run, kept by
the chain_parity cell for the cross-backend chain cell of the same process."""


def _remember_styles(key: tuple[Any, ...], backend: str, run: Any) -> None:
    if len(_BACKEND_RUNS) >= 4 * _SHARED_RUNS_MAX:
        _BACKEND_RUNS.clear()
    _BACKEND_RUNS[(*key, backend)] = (run.train.cpu(), run.rollout.cpu(), dict(run.kernel_ids))


def chain_cross_backend_cell(anchor: str, other: str, workload: Any, contract: Contract,
                             seed: int) -> tuple[str, str, dict[str, Any], str | None]:
    """The cross-backend chain cell (contract section ``cross_backend.chain``): on every run of the
    workload's chain plan, teacher forcing on one backend against rollout decode on the other, both
    ways (``anchor`` trains and ``other`` rolls out, then the reverse), judged by the strict profile
    (every active token's dlogp exactly 0) over all runs together.

    Each backend's logprobs come from the chain_parity cell of this process when it ran (the same
    weights, fixture and kernels), else they are computed here. Negative control: a one-ulp change
    planted on one token of a copy of ``other``'s rollout logprobs, scored against ``anchor``'s
    teacher forcing, must fail the strict profile.

    Status: green when both directions are strict and the control is caught; red otherwise;
    ``n/a`` while the contract does not declare the chain bit-exact across backends
    (``cross_backend.chain.declared_bit_exact``), with the comparison still made and recorded.
    """
    from rl_engine.ops.transforms import plant_ulp

    wname, plan, device, config = _plan_of(workload)
    t_start = time.perf_counter()
    sides: dict[str, dict[str, list[torch.Tensor]]] = {b: {"train": [], "rollout": []} for b in (anchor, other)}
    kernel_ids: dict[str, dict[str, str]] = {anchor: {}, other: {}}
    sources: dict[str, str] = {}
    per_run = []
    for offset, scale in plan["runs"]:
        run_seed = int(seed) + int(offset)
        key = (plan["model"], plan["fixture"], run_seed, scale, str(device), contract.rms_norm_order)
        batch = None
        for b in (anchor, other):
            if (*key, b) not in _BACKEND_RUNS:
                if batch is None:
                    weights = synthetic_weights(config, run_seed, logit_scale=scale, device=device)
                    batch = make_fixture(plan["fixture"], run_seed, config.vocab_size).batch()
                model = Qwen3Model(weights, b, norm_order=contract.rms_norm_order)
                _remember_styles(key, b, run_styles(model, batch, head=HEAD))
                del model
                _free(device)
                sources[b] = "computed"
            else:
                sources.setdefault(b, "reused from this process's chain_parity cell")
            train, roll, kids = _BACKEND_RUNS[(*key, b)]
            sides[b]["train"].append(train)
            sides[b]["rollout"].append(roll)
            kernel_ids[b].update(kids)
        a_tr, o_tr = sides[anchor]["train"][-1], sides[other]["train"][-1]
        per_run.append({"seed": run_seed, "logit_scale": scale, "active_tokens": int(a_tr.numel()),
                        "teacher_forcing_bitwise_equal": bool(torch.equal(a_tr.view(torch.int32), o_tr.view(torch.int32)))})
        if batch is not None:
            del weights
            _free(device)
    strict = contract.chain_thresholds("strict")
    cat = {b: {k: torch.cat(v) for k, v in sides[b].items()} for b in sides}
    directions = {f"{anchor}_trains_{other}_rolls_out": (cat[anchor]["train"], cat[other]["rollout"]),
                  f"{other}_trains_{anchor}_rolls_out": (cat[other]["train"], cat[anchor]["rollout"])}
    reports, problems = {}, []
    digest = BitsDigest()
    for name, (lhs, rhs) in directions.items():
        rep = chain_metrics(lhs, rhs, strict)
        flat = flat_metrics(rep)
        reports[name] = {"passed": rep.passed, "summary": rep.summary(),
                         "differing_tokens": rep.active_tokens - rep.bitwise_equal_tokens,
                         "first_nonzero_token": rep.first_nonzero_token,
                         **{k: flat[k] for k in ("max_abs_dlogp", "mean_abs_dlogp", "bitwise_equal_tokens", "active_tokens")}}
        if not rep.passed:
            problems.append(f"{name}: {rep.active_tokens - rep.bitwise_equal_tokens}/{rep.active_tokens} active tokens "
                            f"differ (max |dlogp| {flat['max_abs_dlogp']:.3g})")
    for b in (anchor, other):
        digest.add_all(((f"{b}:teacher_forcing_logprobs", cat[b]["train"]), (f"{b}:rollout_logprobs", cat[b]["rollout"])))
    probe = cat[anchor]["train"]  # the first direction's sides, the other's rollout planted
    caught = probe.numel() > 0 and not chain_metrics(probe, plant_ulp(cat[other]["rollout"]), strict).passed
    if not caught:
        problems.append("negative control (planted one-ulp change) was not caught: the check cannot fail")
    details: dict[str, Any] = {
        "profile": "strict", "backends": [anchor, other], "anchor": anchor,
        "declared_bit_exact": contract.cross_backend.chain_declared,
        "active_tokens": int(probe.numel()), "directions": reports, "per_run": per_run,
        "logprobs_source": sources, "kernel_ids": kernel_ids, "head": HEAD, "workload": wname,
        "controls": [{"control": f"planted one-ulp change on one token of a copy of {other}'s rollout logprobs, scored "
                                 f"against {anchor}'s teacher forcing", "caught": caught}],
        "bits_digest": digest.hexdigest(), "wall_time_s": round(time.perf_counter() - t_start, 3),
    }
    kid = f"{chain_kernel_id(anchor, kernel_ids[anchor])}|{chain_kernel_id(other, kernel_ids[other])}"
    equal = sum(r["bitwise_equal_tokens"] for r in reports.values())
    total = sum(r["active_tokens"] for r in reports.values())
    measured = f"{equal}/{total} token logprobs bitwise equal over both directions"
    why = contract.cross_backend.reason_not_declared("chain")
    if why is not None:
        return "n/a", (f"not declared bit-exact across backends by contract {contract.version} "
                       f"(cross_backend.chain: {why}); measured: {measured}"), details, kid
    if problems:
        return RED, "; ".join(problems), details, kid
    return GREEN, f"strict both ways: {measured}", details, kid
