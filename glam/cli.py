"""How every script reports a problem of its input: one line format, one exit status, no
traceback.

A bad input (a missing folder, a file that is not what it should be, a server that cannot be
reached) is the user's to fix, not a bug: the script prints

    error: <what is wrong, naming the file or the option, and what to do>

on stderr and exits with status 2 (1 is Hydra's and the config schema's: a bad config key or
value). A traceback is for a bug of the code. `report` prints and returns the status (for a
`main` that returns it), `fail` prints and exits; `exit_on` turns the exceptions a block may
raise for bad input into `fail`.

Torch-free, like the scripts that read run folders only.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Iterator
from typing import NoReturn

__all__ = [
    "BAD_INPUT",
    "describe_os_error",
    "error_message",
    "exit_on",
    "fail",
    "positive_int",
    "report",
]

BAD_INPUT = 2
"""Exit status of a script stopped by its input (files, folders, options, servers)."""


def error_message(error: BaseException | str) -> str:
    """The message of an error as a script prints it: a `KeyError`'s text without its quotes, an
    `OSError`'s reason and file, an empty message replaced by the error's type."""
    if isinstance(error, str):
        return error
    if isinstance(error, KeyError) and len(error.args) == 1:
        return str(error.args[0])
    if isinstance(error, OSError) and error.errno is not None and error.filename is not None:
        return f"{error.filename}: {describe_os_error(error)}"
    return str(error).strip() or type(error).__name__


def report(error: BaseException | str, *, status: int = BAD_INPUT) -> int:
    """Print `error: MESSAGE` on stderr; return `status` (default 2, bad input), for a `main`
    that returns its exit status."""
    sys.stdout.flush()
    print(f"error: {error_message(error)}", file=sys.stderr, flush=True)
    return status


def fail(error: BaseException | str, *, status: int = BAD_INPUT) -> NoReturn:
    """`report` the error, then exit with `status`."""
    sys.exit(report(error, status=status))


@contextlib.contextmanager
def exit_on(*errors: type[BaseException], status: int = BAD_INPUT) -> Iterator[None]:
    """Run the block; any of `errors` it raises ends the script through `fail`."""
    try:
        yield
    except errors as error:
        fail(error, status=status)


def describe_os_error(error: BaseException) -> str:
    """An operating-system error in a few words (`permission denied`, `no space left on
    device`), without its errno number and file name; another error's first line."""
    code = getattr(error, "errno", None)
    if code is not None:
        words = os.strerror(code)
        return words[:1].lower() + words[1:]
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def positive_int(text: str) -> int:
    """An argparse type: an integer >= 1 (argparse turns the error into `argument --x: ...` and
    exit status 2)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value
