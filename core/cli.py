"""The ``jobprof`` command: check options, list plugins, export and summarise profiles."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from jobprof import __version__
from jobprof.commands import COMMANDS


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="jobprof", description=__doc__)
    parser.add_argument("--version", action="version", version=f"jobprof {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    for command in COMMANDS:
        command.register(sub)
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except (FileNotFoundError, NotADirectoryError) as exc:
        print(f"jobprof: error: {exc}", file=sys.stderr)
        return 1
    except BrokenPipeError:  # `jobprof plugins --json | head`: the reader left, not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141


if __name__ == "__main__":
    raise SystemExit(main())
