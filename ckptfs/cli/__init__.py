"""The ``ckptfs`` and ``mount.ckptfs`` commands: arguments, output for people and for programs, one-line errors."""

from ckptfs.cli.main import main, run

__all__ = ["main", "run"]
