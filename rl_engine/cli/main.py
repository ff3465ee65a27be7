"""``rl-engine``: the command-line entry point.

Exit codes everywhere: 0 pass, 1 a judgment failed, 2 bad usage, bad input or environment; 130 after
Ctrl-C; the gate also exits 143 after SIGTERM or SIGHUP (keeping its finished cells for ``--resume``
in both cases).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rl_engine.errors import RLEngineError

EXIT_PASS, EXIT_FAIL, EXIT_USAGE = 0, 1, 2


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # argparse exits 2 on usage errors; keep the message short
        self.print_usage(sys.stderr)
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    # every command module imported by name: one that fails to import is an error, never a missing command
    from rl_engine.constants import __version__
    from rl_engine.cli import (cmd_audit, cmd_bench, cmd_compare, cmd_contract, cmd_env, cmd_gate, cmd_generate,
                               cmd_parity, cmd_report, cmd_rl)
    from rl_engine.cli.args import EXIT_CODES

    parser = _Parser(prog="rl-engine", description="Deterministic BF16 kernels and the WS1 precision gate.",
                     epilog="examples:\n  rl-engine gate --out gate-out --ops rms_norm\n  rl-engine report gate-out\n"
                            "  rl-engine compare mine.pt ref.pt --mode accuracy\n  rl-engine COMMAND --help\n\n" + EXIT_CODES,
                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"rl-engine {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser, metavar="COMMAND")
    for module in (cmd_gate, cmd_report, cmd_compare, cmd_parity, cmd_generate, cmd_rl, cmd_env, cmd_contract,
                   cmd_audit, cmd_bench):
        module.register(sub)
    return parser


def _interrupted_gate_hint(out: Path) -> str:
    """What to run after a Ctrl-C: resume missing cells, or only re-render the reports when every
    cell had finished (the interrupt came while the reports were written)."""
    import json

    try:
        complete = bool(json.loads((out / "evidence.json").read_text()).get("complete"))
    except (OSError, ValueError, AttributeError):
        return f"; no readable {out}/evidence.json yet — run the gate again"
    if complete:
        return f"; every cell had finished ({out}/evidence.json is complete) — write the reports with: rl-engine report {out}"
    return f"; the cells finished so far are in {out}/evidence.json — finish with: rl-engine gate --resume {out}"


class Terminated(KeyboardInterrupt):
    """SIGTERM (e.g. from ``timeout``) or SIGHUP (the terminal closed), raised like Ctrl-C so that cleanup runs: the gate's fresh
    subprocesses are stopped and the finished cells are written before the process exits 143."""


def _on_sigterm(signum, frame):
    raise Terminated()


def main(argv: list[str] | None = None) -> int:
    import signal
    import threading

    parser = build_parser()
    args = parser.parse_args(argv)
    previous = {}
    # only the gate has helper processes and partial evidence to clean up; torch is imported first, as
    # an exception raised inside torch's own import of numpy is swallowed there (numpy half-imported)
    if args.command == "gate" and threading.current_thread() is threading.main_thread():
        import torch  # noqa: F401

        for sig in (signal.SIGTERM, getattr(signal, "SIGHUP", None)):
            if sig is not None:
                previous[sig] = signal.signal(sig, _on_sigterm)
    try:
        return int(args.func(args))
    except RLEngineError as exc:
        print(f"rl-engine {args.command}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt as exc:
        hint = ""
        out = getattr(args, "out", None) or getattr(args, "resume", None)
        if args.command == "gate" and out:
            hint = _interrupted_gate_hint(Path(out))
        what = "terminated (SIGTERM/SIGHUP)" if isinstance(exc, Terminated) else "interrupted"
        print(f"rl-engine {args.command}: {what}{hint}", file=sys.stderr)
        return 143 if isinstance(exc, Terminated) else 130
    except BrokenPipeError:  # e.g. `rl-engine diff A B | head`: the reader went away
        import os

        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_USAGE
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
