"""Metadata cache entries of ``.pt2`` archives: opened from the entry, an archive is its parse (tree, info, ls,
index, every tensor's bytes), its payload archives' storages (no record of their own) included."""

from __future__ import annotations

import random
import zipfile
from pathlib import Path
from typing import Any

import pytest
from pt2_writer import exported, save

from ckptfs.cache import source_key
from ckptfs.cache.entry_file import decode_entry, encode_entry
from ckptfs.checkpoint import Checkpoint, open_checkpoint
from ckptfs.errors import CkptfsError
from ckptfs.limits import Limits
from ckptfs.sources import LocalFileSource

from cache.helpers import entries, hostile_outcome
from cache.test_cached_equals_parsed import open_twice, views


def older_layout(path: Path) -> Path:
    """torch ≤ 2.7's layout: torch.save archives of the state dict and constants, stored in the zip."""
    from torch._export.serde.schema import SCHEMA_VERSION
    from torch._export.serde.serialize import serialize

    artifact = serialize(exported())
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("serialized_exported_program.json", artifact.exported_program)
        z.writestr("serialized_state_dict.pt", artifact.state_dict)
        z.writestr("serialized_constants.pt", artifact.constants)
        z.writestr("version", ".".join(map(str, SCHEMA_VERSION)))
    return path


@pytest.mark.parametrize("layout", ["archive_version 0", "torch 2.7"])
def test_a_pt2_from_the_cache_is_its_parse(tmp_path: Path, cache_dir: Path, monkeypatch: pytest.MonkeyPatch,
                                           layout: str) -> None:
    path = save(exported(), tmp_path / "m.pt2") if layout == "archive_version 0" else older_layout(tmp_path / "o.pt2")
    parsed, cached = open_twice(path, cache_dir, monkeypatch)
    assert len(entries(cache_dir)) == 1
    assert cached == parsed
    assert len([b for b in parsed["bytes"] if b]) >= 10


VALUES = (-2, -1, 0, 1, 8, 30, 1 << 20, 1 << 40, (1 << 63) - 1, -(1 << 63))


def test_hostile_pt2_entries_with_a_matching_digest(tmp_path: Path, cache_dir: Path) -> None:
    """Record and storage columns changed in an entry whose digest was made to match (an embedded storage made
    to claim a record, a record made embedded ...): refused, discarded, or reads that work or fail cleanly."""
    path = older_layout(tmp_path / "o.pt2")
    with open_checkpoint(path, cache_dir=cache_dir) as ck:
        reference = views(ck)
    (entry,) = entries(cache_dir)
    good = entry.read_bytes()
    source = LocalFileSource(path)
    key = source_key(source, Limits())
    source.close()
    assert key is not None
    sections = decode_entry(key, good)
    targets = sorted(name for name in sections if name.startswith(("zip_", "storage_")))
    rng = random.Random(2)
    outcomes = set()
    for _ in range(300):
        hostile = dict(sections)
        name = rng.choice(targets)
        value = hostile[name].copy()
        value[rng.randrange(len(value))] = rng.choice(VALUES)
        hostile[name] = value
        entry.write_bytes(encode_entry(key, hostile))
        outcomes.add(hostile_outcome(path, cache_dir, entry, good, reference, views_or_refused))
    assert {"discarded", "used"} <= outcomes


def views_or_refused(ck: Checkpoint) -> dict[str, Any] | None:
    try:
        return views(ck)
    except CkptfsError:
        return None
