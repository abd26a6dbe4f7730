"""The command line: parse, call the operations, print. The one place errors become exit codes.

* ``main``     — argparse, lazy command loading (``--help`` imports no command), exit codes.
* ``context``  — Context: what a command reads (config, options, streams, terminal width).
* ``termfit``  — tables that fit the terminal, Chinese text included; ``progress`` on long work.
* ``commands/``— one module a command; shared helpers in ``commands/_common.py``.
"""
