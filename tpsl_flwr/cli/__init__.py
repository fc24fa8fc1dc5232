"""The ``tpsl-flwr`` command line: one module per sub-command.

:mod:`~tpsl_flwr.cli.main` builds the parser from each command module and runs
the handler; ``python -m tpsl_flwr.cli`` is the same command.
"""
