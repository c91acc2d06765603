"""The ``jobprof`` command: check options, list plugins, export and summarise profiles."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from jobprof import __version__
from jobprof.cli import check, control, diff, export, importer, kineto, merge, plugins, report, summary
from jobprof.cli._common import printable
from jobprof.files import batchgc, rawstore
from jobprof.plugin.reporter import Reporter

#: in the order ``jobprof --help`` lists them
COMMANDS = (check, plugins, export, summary, report, diff, merge, kineto, importer, control)

#: the arguments that name what a command reads, for the safety net's message
_INPUTS = ("prof_dir", "prof_dirs", "prof_a", "prof_b", "traces")


def _inputs(args: argparse.Namespace) -> str:
    found: list[str] = []
    for name in _INPUTS:
        value = getattr(args, name, None)
        found += [str(v) for v in value] if isinstance(value, list) else [str(value)] if value else []
    return ", ".join(found) or "its input"


def _os_error(exc: OSError) -> str:
    text = exc.strerror or str(exc)
    return text if exc.filename is None or str(exc.filename) in text else f"{exc.filename}: {text}"


def _interrupted(exc: BaseException) -> bool:
    """Did Ctrl-C cause ``exc``?  A KeyboardInterrupt that lands inside a lock's bookkeeping (a
    ``Condition.wait`` in ``future.result()``) comes out as RuntimeError("cannot release
    un-acquired lock") with the interrupt as its context (CI run 87: `summary --jobs 2`)."""
    seen: set[int] = set()
    cause: BaseException | None = exc
    while cause is not None and id(cause) not in seen:
        if isinstance(cause, KeyboardInterrupt):
            return True
        seen.add(id(cause))
        cause = cause.__cause__ or cause.__context__
    return False


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="jobprof", description=__doc__)
    parser.add_argument("--version", action="version", version=f"jobprof {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    for command in COMMANDS:
        command.register(sub)
    args = parser.parse_args(argv)
    batchgc.tune()
    reporter = Reporter()
    # every problem the readers find in the profile (a bad line, a bad metadata file) is one
    # warning naming the file; the command goes on with the rest
    with rawstore.reporting(lambda text: reporter.warning(printable(text))):
        try:
            return args.func(args)
        except (FileNotFoundError, NotADirectoryError) as exc:
            print(printable(f"jobprof: error: {exc}"), file=sys.stderr)
            return 1
        except KeyboardInterrupt:  # Ctrl-C: the workers are ended already (facts._local)
            print(f"jobprof {args.command}: interrupted", file=sys.stderr)
            return 130
        except BrokenPipeError:  # `jobprof plugins --json | head`: the reader left, not an error
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return 141
        except OSError as exc:  # a file the command could not read or write: named, no traceback
            print(printable(f"jobprof {args.command}: error: {_os_error(exc)}"), file=sys.stderr)
            return 1
        except Exception as exc:
            if _interrupted(exc):  # see there
                print(f"jobprof {args.command}: interrupted", file=sys.stderr)
                return 130
            # the safety net: a profile shaped in a way no reader expected is a bug to report,
            # shown as one line, not a traceback
            print(printable(f"jobprof {args.command}: internal error reading {_inputs(args)}: "
                            f"{type(exc).__name__}: {exc} (please report)")[:2000], file=sys.stderr)
            return 1


if __name__ == "__main__":
    raise SystemExit(main())
