"""The ``jobprof`` command: ``main`` parses the command line; one module per subcommand, each
with ``register(subparsers)`` adding its parser and setting ``func`` to the function that runs it."""
