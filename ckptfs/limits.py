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

import re
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
    max_inflated_bytes: int = 1 << 40
    """Largest declared size of a deflated storage record (re-zipped archives). Such a record is never held
    in memory whole (reads resume from a seek index, ``formats.deflate_index``); this bounds the work of
    inflating up to a read, as a file this size needs ≥ 1/1032 of it compressed."""
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
    it appears, plus the path to every tensor and alias (its parent's keys: a state dict's keys count once).

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

    @classmethod
    def defaults(cls) -> dict[str, int]:
        return {f.name: f.default for f in fields(cls)}  # type: ignore[misc]


SUMMARIES = {
    "max_pickle_bytes": "size of a pickle that is interpreted (after inflation)",
    "max_pickle_inflation": "how many times its stored size a deflated pickle may inflate to (+1 MiB)",
    "max_inflated_bytes": "declared size of a deflated storage record (read through a seek index)",
    "max_memo_entries": "pickle memo size",
    "max_stack_depth": "pickle stack size, and MARKs open at once",
    "max_zip_entries": "records in a zip's central directory",
    "max_tensors": "tensor records",
    "max_tree_nodes": "objects visited walking the tree (each shared object once)",
    "max_tree_depth": "nesting depth of containers",
    "max_key_bytes": "keys that listings spell out, and the path to each tensor and alias",
    "max_generated_bytes": "a text made from the checkpoint: index.json, a sidecar, info --json",
}
"""One line per limit, for ``ckptfs --help``."""

UNITS = {"": 1, "k": 10**3, "K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12,
         "Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40}
"""SI multiples (k, M, G, T) and binary ones (Ki, Mi, Gi, Ti); a ``B`` may follow either."""
_QUANTITY = re.compile(r"([0-9]{1,40})(?:\.([0-9]{1,40}))? ?(k|K|M|G|T|Ki|Mi|Gi|Ti|)B?")
UNITS_HELP = "an integer, optionally with a unit: 1000, 10k, 2M, 1.5G (SI); 64KiB, 256MiB, 4GiB, 1TiB"


def parse_quantity(text: str) -> int:
    """``1000``, ``10k``, ``2M``, ``256MiB``, ``1.5GiB`` … as an int; ValueError saying what is accepted if not."""
    match = _QUANTITY.fullmatch(text.strip())
    if match is None:
        raise ValueError(f"{text!r} is not a size or count: expected {UNITS_HELP}")
    whole, fraction, unit = match.group(1), match.group(2) or "", match.group(3)
    value, remainder = divmod(int(whole + fraction) * UNITS[unit], 10 ** len(fraction))
    if remainder:
        raise ValueError(f"{text!r} is not a whole number")
    return value


def format_quantity(value: int, binary: bool) -> str:
    """The shortest exact spelling ``parse_quantity`` reads back: ``256MiB`` for bytes, ``10M`` for counts."""
    units = ("Ti", "Gi", "Mi", "Ki") if binary else ("T", "G", "M")
    for unit in units:
        if value and value % UNITS[unit] == 0:
            return f"{value // UNITS[unit]}{unit}{'B' if binary else ''}"
    return str(value)
