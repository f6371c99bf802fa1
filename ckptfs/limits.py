"""Safety limits applied while parsing untrusted checkpoints.

The defaults admit every honest checkpoint we know of while keeping a hostile
file to a bounded amount of memory and time. Raise them through
``ckptfs.open(path, limits=Limits(...))`` or the CLI's ``--limit NAME=VALUE``.

Cost model: interpreting a pickle takes at most about 1.5 µs and 250 bytes of
memory per pickle byte (a flood of the cheapest opcodes that each allocate),
so ``max_pickle_bytes`` bounds open time and memory; an honest state-dict
pickle takes ~150 bytes per tensor. Everything that could grow faster than
the input is capped on its own: memo indices, stack and MARK depth, shared
and cyclic references (walked once), nesting depth, declared lengths (checked
against the bytes present), integer sizes, and deflate (``max_pickle_inflation``,
``max_inflated_bytes``).
"""

from __future__ import annotations

from dataclasses import dataclass, fields


@dataclass(frozen=True)
class Limits:
    max_pickle_bytes: int = 256 << 20
    """Largest pickle (``data.pkl``, ``constants.pkl``, the legacy pickles) interpreted, after inflation."""
    max_pickle_inflation: int = 100
    """A deflated pickle (or TorchScript code record) may inflate to at most this many times its stored size,
    plus 1 MiB.

    Honest pickles compress 2–10×; a flood of one opcode compresses 1000× and
    would turn a kilobyte file into gigabytes of parsed objects."""
    max_inflated_bytes: int = 256 << 20
    """Largest deflated storage record (re-zipped archives) inflated into memory when it is read."""
    max_memo_entries: int = 10_000_000
    """Distinct memo slots; the memo is a dict, so a huge index (``LONG_BINPUT 0x7FFFFFFE``) costs one slot."""
    max_stack_depth: int = 10_000_000
    """Values on the pickle stack between two MARKs, and MARKs open at once."""
    max_zip_entries: int = 2_000_000
    """Records in the zip central directory (checked before the directory is parsed)."""
    max_tensors: int = 5_000_000
    """Distinct tensors in the tree."""
    max_tree_nodes: int = 20_000_000
    """Containers and leaves visited when walking the object tree (each object once)."""
    max_tree_depth: int = 1_000
    """Nesting depth of containers; deeper subtrees fail to open."""
    max_key_bytes: int = 64 << 20
    """Total length of the keys that listings spell out, about as JSON text: every key once per place
    it appears, plus every tensor's whole key path.

    ``ls``, ``info --json``, sidecars and the index repeat them; one long key
    met at every level of a deep tree makes gigabytes of them from a file of
    kilobytes. Honest checkpoints take 50-150 bytes a tensor."""
    max_generated_bytes: int = 128 << 20
    """Largest text made from a checkpoint: ``/.ckptfs/index.json``, a sidecar, ``info --json``'s output.

    A long string referenced a million times, or long keys repeated at every
    level of a deep tree, describe gigabytes from a small file: ``info --json``
    fails with this limit's name; a mounted file reads as an I/O error (logged)
    and lists with size 0."""

    @classmethod
    def names(cls) -> list[str]:
        return [f.name for f in fields(cls)]
