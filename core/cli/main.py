"""The ``jobprof`` command: check options, list plugins, export and summarise profiles."""

from __future__ import annotations

import argparse
import os
import signal
import sys
from collections.abc import Sequence
from types import ModuleType

# nothing else at import: the commands are imported by main(), where a Ctrl-C during their
# half second of imports is an interruption like any other, not a traceback
from jobprof import __version__

#: the arguments that name what a command reads, for the safety net's message
_INPUTS = ("prof_dir", "prof_dirs", "prof_a", "prof_b", "traces")


def commands() -> tuple[ModuleType, ...]:
    """The commands, in the order ``jobprof --help`` lists them."""
    from jobprof.cli import check, control, diff, export, importer, kineto, merge, plugins, report, summary

    return (check, plugins, export, summary, report, diff, merge, kineto, importer, control)


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
    """Run one command; its exit status.  ``argv`` None: the program's arguments, run as the
    program (the ``jobprof`` script), which exits right after.

    Ctrl-C, whenever it lands from here on (the commands' imports, arguments, reading, the
    workers, writing the output), ends the command with status 130 and one line on stderr, its
    workers ended.  A command whose output is written before it came did its work: as the
    program, it then ignores Ctrl-C until the process is gone (the exit would otherwise take it
    as a traceback or a death by SIGINT after the whole output) and exits with its own status."""
    program = argv is None
    command = ""
    try:
        parser = _parser()
        args = parser.parse_args(argv)
        command = args.command
        status = _run(args)
        if sys.stdout is not None:  # None: started with stdout closed
            sys.stdout.flush()  # written, not left in a buffer for the exit to write
        if program and _ignore_interrupts():  # one came before the output was written
            raise KeyboardInterrupt
    except KeyboardInterrupt:  # the workers are ended already (jobprof.analysis.workers)
        if program:
            _ignore_interrupts()
            # nothing more of the output: the exit would write what is left of it, and wait
            # for a reader that may be gone
            _drop_stdout()
        print(f"jobprof{' ' + command if command else ''}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `jobprof plugins --json | head`: the reader left, not an error
        _drop_stdout()
        return 141
    return status


def _drop_stdout() -> None:
    """What is left of the output goes nowhere (the exit flushes stdout)."""
    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except (OSError, AttributeError, ValueError):  # no stdout, or not a file
        pass


def _ignore_interrupts() -> bool:
    """SIGINT ignored from now on; whether one was pending (``signal.signal`` runs a pending
    handler before it changes the handler)."""
    came = False
    while True:
        try:
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            return came
        except KeyboardInterrupt:
            came = True


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="jobprof", description=__doc__)
    parser.add_argument("--version", action="version", version=f"jobprof {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    for command in commands():
        command.register(sub)
    return parser


def _run(args: argparse.Namespace) -> int:
    from jobprof.cli._common import printable
    from jobprof.files import batchgc, rawstore
    from jobprof.plugin.reporter import Reporter

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
        except BrokenPipeError:
            raise  # main's
        except OSError as exc:  # a file the command could not read or write: named, no traceback
            print(printable(f"jobprof {args.command}: error: {_os_error(exc)}"), file=sys.stderr)
            return 1
        except Exception as exc:
            if _interrupted(exc):  # see there
                raise KeyboardInterrupt from exc
            # the safety net: a profile shaped in a way no reader expected is a bug to report,
            # shown as one line, not a traceback
            print(printable(f"jobprof {args.command}: internal error reading {_inputs(args)}: "
                            f"{type(exc).__name__}: {exc} (please report)")[:2000], file=sys.stderr)
            return 1


if __name__ == "__main__":
    raise SystemExit(main())
