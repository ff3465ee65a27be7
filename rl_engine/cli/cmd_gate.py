"""``rl-engine gate``: run the four-judgment matrix, write evidence.json, report.md, report.html."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path


JUDGMENT_NAMES = ("forward_accuracy", "gradient_accuracy", "forward_invariance", "gradient_invariance", "repeat",
                  "chain_parity", "cross_backend")
"""The judgments, for ``--help`` without importing the runner (and torch); a test keeps it equal to
:data:`rl_engine.gate.runner.JUDGMENTS`."""
CROSS_BACKEND_SCOPES = ("declared", "all", "none")
"""The scopes of ``--cross-backend``, for the parser without importing torch; a test keeps it equal
to :data:`rl_engine.gate.plan.CROSS_BACKEND_SCOPES`."""


def register(sub) -> None:
    from rl_engine.constants import OPS
    from rl_engine.cli.args import add_list, command

    p = command(sub, "gate", "run the WS1 four-judgment gate and write evidence + reports", [
        "rl-engine gate --out gate-out                       # every op and judgment, every backend that runs here",
        "rl-engine gate --out /tmp/g --ops rms_norm,silu     # two ops (same as --ops rms_norm --ops silu)",
        "rl-engine gate --out /tmp/g --judgments forward_accuracy --backend triton_cuda_bf16",
        "rl-engine gate --resume /tmp/g                      # finish an interrupted run",
    ], description="Run ops x backends x judgments on a workload, write DIR/evidence.json, DIR/report.md, "
                   "DIR/report.html and DIR/plots/, and print the verdict with every red cell.")
    add_list(p, "--backend", "NAME",
             "kernel backends to judge: triton_cuda_bf16, cuda_bf16, a registered plugin, or all "
             "(default: all = every built-in kernel backend that can run here)")
    p.add_argument("--workload", default=None, metavar="NAME",
                   help="input shapes: smoke (small, CPU-friendly) or qwen3-8b (needs a GPU); "
                        "default: qwen3-8b with a GPU, smoke without")
    add_list(p, "--ops", "OP", f"ops to judge, any of: {', '.join(OPS)} (default: all {len(OPS)})")
    add_list(p, "--judgments", "JUDGMENT",
             f"judgments to run, any of: {', '.join(JUDGMENT_NAMES)} (default: all; chain_parity only when "
             "--ops is not given; cross_backend compares cuda_bf16 with triton_cuda_bf16 bit for bit when both "
             "are judged, the chain's cell joining chain_parity)")
    p.add_argument("--out", default=None, metavar="DIR",
                   help="output folder, created if missing; an earlier run there is replaced (required unless --resume)")
    p.add_argument("--resume", default=None, metavar="DIR",
                   help="finish an interrupted run in DIR: only its missing cells run, against the same commit, contract and workload")
    p.add_argument("--cell-timeout", type=_positive_seconds, default=None, metavar="SECONDS",
                   help="mark a cell that runs longer red with reason 'timeout', e.g. --cell-timeout 600 (default: no limit)")
    p.add_argument("--seed", type=_seed, default=0, help="base seed of every input builder, in [0, 2**62) (default 0)")
    p.add_argument("--cross-backend", default="declared", choices=CROSS_BACKEND_SCOPES,
                   help="scope of the informational cross-backend table, made when two or more backends are "
                        "judged without the cross_backend judgment (whose cells record the same rows): "
                        "declared (every case of the ops declared identical on both backends, the first case's "
                        "forward of the others), all (every case, forward and gradients, of every op), none "
                        "(default: declared)")
    p.add_argument("--json", action="store_true",
                   help="print the summary as JSON on stdout (progress still goes to stderr)")
    p.set_defaults(func=run)


def _positive_seconds(text: str) -> float:
    import argparse
    import math

    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive, finite number of seconds, got {text!r}")
    return value


def _seed(text: str) -> int:
    import argparse

    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    # builders add offsets of a few thousand to the base seed; torch.Generator takes a signed 64-bit seed
    if not 0 <= value < 2 ** 62:
        raise argparse.ArgumentTypeError(f"must be in [0, 2**62), got {text}")
    return value


def _check_out(out: Path) -> None:
    from rl_engine.errors import RLEngineError

    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise RLEngineError(f"cannot create output folder {out}: {exc.strerror}") from exc
    if not os.access(out, os.W_OK):
        raise RLEngineError(f"output folder {out} is not writable")
    for name, kind in (("evidence.json", "file"), ("report.md", "file"), ("report.html", "file"), ("plots", "folder")):
        p = out / name
        if p.exists() and (p.is_dir() if kind == "file" else not p.is_dir()):
            raise RLEngineError(f"{p} exists and is not a {kind}; the gate writes a {kind} there")


def run(args) -> int:
    import torch

    from rl_engine import env
    from rl_engine.constants import OPS
    from rl_engine.errors import RLEngineError

    gpu = torch.cuda.is_available()
    if not gpu and not env.triton_interpret():
        env.enable_triton_interpreter()  # before any kernel module is imported
    from rl_engine.contract import load_contract
    from rl_engine.gate.report import write_reports
    from rl_engine.gate.runner import JUDGMENTS, GateConfig, resolve_backends
    from rl_engine.ops.spec import get_workload

    args.backend = ",".join(args.backend) if args.backend else "all"
    resume = None
    if args.resume:
        from rl_engine.gate import evidence as evidence_io

        given = [flag for flag, value in (("--ops", args.ops), ("--judgments", args.judgments), ("--workload", args.workload),
                                          ("--backend", None if args.backend == "all" else args.backend),
                                          ("--seed", None if args.seed == 0 else args.seed)) if value]
        if given:
            raise RLEngineError(f"--resume takes the matrix from the interrupted run; drop {', '.join(given)}")
        resume = evidence_io.load(Path(args.resume) / "evidence.json")
        if resume.get("complete"):
            raise RLEngineError(f"{args.resume}/evidence.json is already complete; nothing to resume")
        if args.out and Path(args.out).resolve() != Path(args.resume).resolve():
            raise RLEngineError("--resume writes into its own folder; leave out --out or give the same folder")
        args.out = args.resume
        args.workload = resume["workload"]["name"]
        args.ops = resume["ops"]
        args.judgments = resume["judgments"]
        args.backend = ",".join(resume["backends"]["judged"])
        args.seed = resume.get("seed", args.seed)
    if not args.out:
        raise RLEngineError("--out DIR is required (or --resume DIR)")
    workload_name = args.workload or ("qwen3-8b" if gpu else "smoke")
    if workload_name == "qwen3-8b" and not gpu:
        raise RLEngineError("workload qwen3-8b needs a CUDA GPU (its shapes are far too large for the CPU interpreter); "
                            "use --workload smoke here")
    workload = get_workload(workload_name)
    ops = list(dict.fromkeys(args.ops)) if args.ops else list(OPS)
    bad = [o for o in ops if o not in OPS]
    if bad:
        raise RLEngineError(f"unknown op(s) {bad}; valid: {', '.join(OPS)}")
    # the chain is a model, not an op: by default it joins only a run over every op
    judgments = (list(dict.fromkeys(args.judgments)) if args.judgments else
                 [j for j in JUDGMENTS if j != "chain_parity" or (_chain_available() and not args.ops)])
    badj = [j for j in judgments if j not in JUDGMENTS]
    if badj:
        raise RLEngineError(f"unknown judgment(s) {badj}; valid: {', '.join(JUDGMENTS)}")
    contract = load_contract()  # the run's one contract, handed to everything below
    backends, left_out = resolve_backends(args.backend, contract)
    out = Path(args.out)
    _check_out(out)
    kernels = [b for b in backends if b in ("triton_cuda_bf16", "cuda_bf16")]
    why = "GPU present" if gpu else ("no GPU: Triton kernels run in the CPU interpreter" if kernels else "no GPU")
    chosen = "chosen by default" if args.workload is None else "requested"
    if resume is not None:
        chosen = "from the resumed run"
    print(f"rl-engine gate: workload {workload_name} ({chosen}; {why}); backends {', '.join(backends)}; "
          f"{len(ops)} op{'s' if len(ops) != 1 else ''}; judgments {', '.join(judgments)}", file=sys.stderr)
    if resume is None and (out / "evidence.json").is_file():
        print(f"rl-engine gate: {out} holds an earlier run; its evidence and reports are replaced", file=sys.stderr)
    elif resume is not None:
        print(f"rl-engine gate: resuming {out}: {len(resume['cells'])} finished cells kept", file=sys.stderr)
    for lo in left_out:
        print(f"rl-engine gate: backend {lo['backend']} left out: {lo['reason']}", file=sys.stderr)
    requested = [args.backend]
    if resume is not None:  # the first run's request and the backends it could not judge stay on record
        requested, left_out = resume["backends"]["requested"], resume["backends"]["left_out"]
    config = GateConfig(ops=ops, backends=backends, judgments=judgments, workload=workload, out_dir=out,
                        seed=args.seed, requested_backends=requested, left_out=left_out,
                        cell_timeout=args.cell_timeout, resume=resume, cross_backend=args.cross_backend)
    if resume is not None:
        _check_resume(resume, config, contract)
    evidence = _run_with_progress(config, contract)
    md, html = write_reports(evidence, out)
    s = evidence["summary"]
    if args.json:
        print(json.dumps({"summary": s, "root_cause": evidence["root_cause"], "evidence": str(out / "evidence.json"),
                          "report_md": str(md), "report_html": str(html), "wall_time_s": evidence["wall_time_s"]}, indent=1))
    else:
        from rl_engine.gate.report import summary_lines

        print("\n".join(summary_lines(evidence)))
        print(f"({evidence['wall_time_s']:.1f} s) -> {out / 'evidence.json'}, {md}, {html}")
    if s.get("green", 0) + s.get("red", 0) == 0:
        print("rl-engine gate: nothing was judged (every cell is n/a or not provided); check --ops, --judgments and "
              "--backend", file=sys.stderr)
        return 2
    return 0 if s.get("red", 0) == 0 else 1


def _check_resume(old, config, contract) -> None:
    """Refuse (exit 2) when the commit, contract, workload or matrix changed since the first run."""
    from rl_engine import provenance
    from rl_engine.errors import RLEngineError
    from rl_engine.gate.runner import resume_identity

    now = {"provenance": provenance.git_state(), "contract": contract.identity(),
           "workload": config.workload.as_dict(), "ops": config.ops, "judgments": config.judgments,
           "backends": {"judged": config.backends}, "seed": config.seed}
    a, b = resume_identity(old), resume_identity(now)
    changed = [k for k in a if a[k] != b[k]]
    if changed:
        raise RLEngineError("cannot resume: " + "; ".join(f"{k} was {a[k]!r}, now {b[k]!r}" for k in changed))
    stale = _stale_kernel_ids(old)
    if stale:
        raise RLEngineError("cannot resume: the kernel source changed since these cells ran: " + "; ".join(stale[:5])
                            + (f" (+{len(stale) - 5} more)" if len(stale) > 5 else "") + "; start a new run")


def _stale_kernel_ids(old) -> list[str]:
    """Kept op cells whose recorded kernel id (it hashes the implementation's source file) differs
    from the current source's: a modified file edited again between the run and its resumption."""
    from rl_engine.backends.registry import BACKENDS
    from rl_engine.provenance import kernel_id
    from rl_engine.ops.registry import get_spec

    stale, seen = [], {}

    def now(op: str, backend: str) -> str | None:
        if (op, backend) not in seen:
            impl = get_spec(op).impls.get(backend)
            seen[(op, backend)] = kernel_id(op, backend, impl) if impl is not None else None
        return seen[(op, backend)]

    for c in old["cells"]:
        kid, op, backend = c.get("kernel_id"), c["op"], c["backend"]
        if not kid or op == "chain" or backend not in BACKENDS:
            continue
        # a cross_backend cell records "<anchor's id>|<other's id>" (details.backends: anchor, other)
        pairs = (list(zip(c.get("details", {}).get("backends", []), kid.split("|")))
                 if c["judgment"] == "cross_backend" else [(backend, kid)])
        for b, k in pairs:
            if b in BACKENDS and now(op, b) != k:
                stale.append(f"{op}/{b}: {k} then, {now(op, b)} now")
    return list(dict.fromkeys(stale))


def _chain_available() -> bool:
    try:
        import rl_engine.chain.gate  # noqa: F401
    except ImportError:
        return False
    return True


class _Tally:
    """Counts of the finished cells, like pytest's ``5 passed, 1 failed`` line."""

    def __init__(self):
        self.counts = {"green": 0, "red": 0, "n/a": 0, "not provided": 0}

    def add(self, cell) -> None:
        self.counts[cell["status"]] = self.counts.get(cell["status"], 0) + 1

    def text(self, markup: bool = False) -> str:
        parts = []
        for k, v in self.counts.items():
            if v or k in ("green", "red"):
                word = f"{v} {k}"
                if markup and k == "red" and v:
                    word = f"[bold red]{word}[/]"
                elif markup and k == "green":
                    word = f"[green]{word}[/]"
                parts.append(word)
        return ", ".join(parts)


def _run_with_progress(config, contract):
    """Run the gate with live progress on stderr: a rich bar that counts green / red / n/a as the
    cells finish, or (CI, NO_COLOR, not a terminal) one plain line per cell. A red cell is printed
    with its one-line reason when it happens."""
    from rl_engine import env
    from rl_engine.gate.report import cell_tag, one_line
    from rl_engine.gate.runner import plan, run_gate

    total = len(plan(config))
    tally = _Tally()
    if env.rich_disabled() or not sys.stderr.isatty():
        def on_cell(cell, i, n):
            tally.add(cell)
            line = f"[{i}/{n}] {cell['status'].upper() if cell['status'] == 'red' else cell['status']:5s} {cell_tag(cell)} " \
                   f"({cell['duration_s']:.1f}s)"
            if cell["status"] == "red":
                line += f": {one_line(cell.get('reason', ''))}"
            try:
                print(line + f"  [{tally.text()}]", file=sys.stderr, flush=True)
            except BrokenPipeError:  # nobody reads the progress any more; the run goes on
                pass
        return run_gate(config, contract, on_cell=on_cell)
    from rich.markup import escape
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TextColumn("{task.fields[tally]}"), TimeElapsedColumn(), transient=False) as progress:
        task = progress.add_task("gate", total=total, tally=tally.text(markup=True))

        def on_cell(cell, i, n):
            tally.add(cell)
            if cell["status"] == "red":
                progress.console.print(f"[bold red]RED[/] {escape(cell_tag(cell))}: {escape(one_line(cell.get('reason', '')))}")
            progress.update(task, advance=1, description=f"{cell['op']:>20s}", tally=tally.text(markup=True))
        return run_gate(config, contract, on_cell=on_cell)
