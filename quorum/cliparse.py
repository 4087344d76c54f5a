"""The argument parser of every ``kraftkeeper`` command line (the engine's, the operator's, the
reports'): a usage error prints the usage, then one line in the product's ``CODE: message`` form,
``INVALID_REQUEST: PROG: what is wrong``, and exits 2, so scripts read it like any other refusal.
"""

from __future__ import annotations

import argparse
import sys
from typing import NoReturn

__all__ = ["USAGE_EXIT", "ArgumentParser"]

USAGE_EXIT = 2  # argparse's own exit code for a usage error, kept


class ArgumentParser(argparse.ArgumentParser):
    """argparse reporting usage errors as ``INVALID_REQUEST: PROG: message`` (module docstring);
    pass it as ``parser_class`` to ``add_subparsers`` so subcommands do the same."""

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        sys.stderr.write(f"INVALID_REQUEST: {self.prog}: {message}\n")
        raise SystemExit(USAGE_EXIT)
