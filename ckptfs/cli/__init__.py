"""The ``ckptfs`` and ``mount.ckptfs`` commands: arguments, output for people and for programs, one-line errors."""

from __future__ import annotations

from ckptfs.cli.interrupts import exit_on_interrupt

TYPE_CHECKING = False  # not typing's: this runs before Ctrl-C is caught (cli.interrupts)
if TYPE_CHECKING:
    from typing import NoReturn

__all__ = ["run"]


def run() -> NoReturn:
    """The ``ckptfs`` command; Ctrl-C is caught before the command's modules are imported (they take a while)."""
    exit_on_interrupt()
    import gc

    # The cyclic collector's passes over what ~200 modules' imports make, which all lives on, are ~8% of their time.
    gc.disable()
    try:
        from ckptfs.cli.main import run as run_command
    finally:
        gc.enable()
    run_command()
