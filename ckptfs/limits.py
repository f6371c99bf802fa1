"""Safety limits applied while parsing untrusted checkpoints.

The defaults admit every honest checkpoint we know of while keeping a hostile
file to a bounded amount of memory and time. Raise them through
``ckptfs.open(path, limits=Limits(...))`` or the CLI's ``--limit NAME=VALUE``.
"""

from __future__ import annotations

from dataclasses import dataclass, fields


@dataclass(frozen=True)
class Limits:
    max_pickle_bytes: int = 1 << 30
    """Largest pickle (``data.pkl``, legacy main pickle) that is interpreted."""
    max_memo_entries: int = 10_000_000
    max_stack_depth: int = 10_000_000
    max_zip_entries: int = 2_000_000
    max_tensors: int = 5_000_000
    max_tree_nodes: int = 20_000_000
    """Containers and leaves visited when walking the object tree (each object once)."""
    max_tree_depth: int = 1_000
    """Nesting depth of containers; deeper subtrees fail to open."""

    @classmethod
    def names(cls) -> list[str]:
        return [f.name for f in fields(cls)]
