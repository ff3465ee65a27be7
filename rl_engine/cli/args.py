"""One convention for every ``rl-engine`` command: lists given as repeated or comma-separated
values alike, an example and the exit codes at the end of every ``--help``."""

from __future__ import annotations

import argparse

EXIT_CODES = """exit codes:
  0    pass (every judged cell green / the metric holds)
  1    a judgment failed (a red cell, a failed profile, a mismatch), or the run is incomplete
  2    bad usage, bad input or environment (the message says what and where)
  130  interrupted by Ctrl-C
  143  (gate) stopped by SIGTERM or SIGHUP; finished cells are kept for --resume"""


class ListAction(argparse.Action):
    """``--opt a,b``, ``--opt a --opt b`` and ``--opt a b`` all give ``["a", "b"]`` (duplicates
    dropped, order kept). Use with ``nargs="+"``."""

    def __call__(self, parser, namespace, values, option_string=None):
        items = list(getattr(namespace, self.dest, None) or [])
        for v in values if isinstance(values, list) else [values]:
            for part in str(v).split(","):
                part = part.strip()
                if not part:
                    noun = self.dest[:-1] if self.dest.endswith("s") else self.dest
                    parser.error(f"{option_string} {v!r} names no {noun} (an empty name); give a name or a comma list")
                if part not in items:
                    items.append(part)
        setattr(namespace, self.dest, items)


def add_list(p: argparse.ArgumentParser, flag: str, metavar: str, help: str, **kw) -> None:
    """An option holding a list (see :class:`ListAction`)."""
    p.add_argument(flag, nargs="+", action=ListAction, metavar=metavar, default=kw.pop("default", None),
                   help=help + f" (repeat the option or separate with commas: {flag} A,B)", **kw)


def command(sub, name: str, summary: str, examples: list[str], description: str | None = None):
    """A subcommand parser whose ``--help`` ends with examples and the exit codes."""
    epilog = "examples:\n" + "\n".join(f"  {e}" for e in examples) + "\n\n" + EXIT_CODES
    return sub.add_parser(name, help=summary, description=description or summary, epilog=epilog,
                          formatter_class=argparse.RawDescriptionHelpFormatter)
