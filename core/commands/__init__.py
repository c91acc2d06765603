"""The subcommands of ``jobprof``: one module per command, each with ``register(subparsers)``
adding its parser and setting ``func`` to the function that runs it."""

from jobprof.commands import check, diff, export, kineto, merge, plugins, report, summary

#: in the order ``jobprof --help`` lists them
COMMANDS = (check, plugins, export, summary, report, diff, merge, kineto)
