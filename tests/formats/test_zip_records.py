"""The zip directory kept as the compiled scanner's rows (``ZipRecords``) against the Python loop's entries.

Both ways give the same records in the same order, the same entry for every name, the same answer for names no
record has, the same error where the directory is wrong, and the same data offsets: on archives Python's zipfile
writes with names drawn around torch's ``<archive>/data/<n>`` pattern, and on torch-written checkpoints.
"""

from __future__ import annotations

import io
import struct
import warnings
import zipfile
from array import array
from pathlib import Path
from typing import Any

import pytest
from corpus import CorpusFile, write_raw_archive
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ckptfs
from ckptfs.errors import CkptfsError
from ckptfs.formats.prefetch import Prefetch
from ckptfs.formats.zip_archive import ZipArchive
from ckptfs.formats import zip_records
from ckptfs.formats.zip_records import ZipRecords
from ckptfs.pickle import cscan
from ckptfs.sources import BytesSource
from hostile.checks import compiled_scanner, three_paths
from hostile.picklegen import dct, i, ints, pickle, s, storage_pid, tensor_v2

pytestmark = pytest.mark.skipif(cscan.LIBRARY is None, reason="the compiled scanner is not built")

STEMS = st.one_of(
    st.integers(0, 12).map(lambda n: f"data/{n}"),
    st.sampled_from(["data/00", "data/07", "data/-1", "data/1x", "data/", "data/99999999999999999999",
                     "data/1000000000000000000", "data.pkl", "version", ".data/version", "byteorder",
                     "constants/0", "constants.pkl", "code/x.py", "data/0/1", "Data/1"]),
)
NAMES = st.lists(st.tuples(st.sampled_from(["arch/", "arch/", "arch/", "other/", ""]), STEMS)
                 .map("".join), min_size=1, max_size=14)
PROBES = ["arch/data/0", "arch/data/3", "arch/data/12", "arch/data/13", "arch/data/00", "arch/data/+1",
          "arch/data/١", "arch/data.pkl", "arch/version", "other/data/0", "arch/nothing", "arch/data/"]


def _zip(names: list[str], *, order: list[int] | None = None) -> bytes:
    out = io.BytesIO()
    with warnings.catch_warnings(), zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as archive:
        warnings.simplefilter("ignore", UserWarning)  # zipfile warns of a name written twice
        for i, name in enumerate(names):
            archive.writestr(name, bytes(range(i % 7)) * (i + 1))
        if order is not None:
            archive.filelist[:] = [archive.filelist[i] for i in order]
    return out.getvalue()


def _opened(data: bytes, compiled: bool) -> ZipArchive | CkptfsError:
    with compiled_scanner(compiled):
        try:
            return ZipArchive(Prefetch(BytesSource(data)))
        except CkptfsError as exc:
            return exc


def _same(data: bytes) -> tuple[Any, Any]:
    rows, loop = _opened(data, True), _opened(data, False)
    if isinstance(loop, CkptfsError):
        assert (type(rows), str(rows)) == (type(loop), str(loop))
        return rows, loop
    assert isinstance(rows, ZipArchive)
    assert rows.prefix == loop.prefix
    assert list(rows.entries) == list(loop.entries)
    assert len(rows.entries) == len(loop.entries)
    for name in loop.entries:
        assert rows.entries.get(name) == loop.entries[name] == rows.entries[name], name
    for probe in PROBES:
        assert (probe in rows.entries) == (probe in loop.entries), probe
        assert rows.entries.get(probe) == loop.entries.get(probe), probe
    return rows, loop


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(NAMES)
def test_records_found_the_same_both_ways(names: list[str]) -> None:
    rows, loop = _same(_zip(names))
    if isinstance(loop, ZipArchive) and all(n.startswith("arch/") for n in names):
        assert isinstance(rows.entries, ZipRecords)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.integers(0, 9), min_size=2, max_size=10, unique=True).flatmap(
    lambda numbers: st.tuples(st.just(numbers), st.permutations(range(len(numbers))))))
def test_data_offsets_the_same_both_ways(drawn: tuple[list[int], list[int]]) -> None:
    """Offsets of every numbered record, here read from their local headers (zipfile pads no data): also with the
    directory in another order than the records, which the Python loop reads."""
    numbers, order = drawn
    names = ["arch/data.pkl", *(f"arch/data/{n}" for n in numbers)]
    for directory_order in (None, [0, *(1 + i for i in order)]):
        rows, loop = _same(_zip(names, order=directory_order))
        assert isinstance(rows, ZipArchive) and isinstance(loop, ZipArchive)
        stored = [f"arch/data/{n}" for n in numbers]
        if isinstance(rows.entries, ZipRecords):
            records = rows.entries
            got = records.resolve_storages([records.row(n) for n in stored], 64, rows.header_data_offset)
            assert got == [records[n].data_offset for n in stored]
        else:
            entries = [rows.entries[n] for n in stored]
            rows.resolve_data_offsets(entries, 64)
            got = [e.data_offset for e in entries]
        expected = [loop.entries[n] for n in stored]
        loop.resolve_data_offsets(expected, 64)
        assert got == [e.data_offset for e in expected]
        with zipfile.ZipFile(io.BytesIO(_zip(names))) as archive:
            assert [loop.source.read(e.data_offset, e.size) for e in expected] == [archive.read(n) for n in stored]


def test_a_name_twice_is_the_same_error_both_ways() -> None:
    for names in (["arch/data.pkl", "arch/version", "arch/data.pkl"], ["arch/data.pkl", "arch/data/1", "arch/data/1"],
                  ["arch/data/00", "arch/data/00", "arch/data/0"]):
        rows, loop = _same(_zip(names))
        assert isinstance(loop, CkptfsError) and "duplicate zip record" in str(loop)


@pytest.mark.parametrize("name", ["r1_views_containers", "r2_every_dtype", "r4_skip_data", "r5_scripted", "r9_no_crc",
                                  "r9_align4096", "r9_protocol4"])
def test_torch_written_offsets_the_same_both_ways(corpus: dict[str, CorpusFile], name: str) -> None:
    """Torch's layout: each storage's offset computed by the rule in C equals the Python loop's and its local
    header's."""
    path: Path = corpus[name].path
    found = []
    for compiled in (True, False):
        with compiled_scanner(compiled), ckptfs.open(path) as ck:
            entries = ck._reader.parsed.archive.entries  # type: ignore[attr-defined]
            assert isinstance(entries, ZipRecords) == compiled
            found.append([(s.record, s.offset, s.size) for s in ck.storages])
            for storage in ck.storages:
                archive = ck._reader.parsed.archive  # type: ignore[attr-defined]
                archive.check_local_header(entries[archive.prefix + storage.record])
    assert found[0] == found[1] and found[0]


KEYS = ["0", "1", "7", "07", "00", "12", "x", "1e3", "99999999999999999999", "3 "]


def _read_all(path: Path) -> Any:
    """Each tensor's bytes and its storage's record and offset, or the error's type and message."""
    try:
        with ckptfs.open(path) as ck:
            return [(t.storage.record, t.storage.offset, ck.read(t)) for t in ck.tensors]
    except CkptfsError as exc:
        return type(exc).__name__, str(exc)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.sampled_from(KEYS[:-1]), min_size=1, max_size=6), st.sets(st.sampled_from(KEYS), max_size=10))
def test_storage_keys_around_the_numbering_the_same_on_every_path(tmp_path: Path, keys: list[str],
                                                                  recorded: set[str]) -> None:
    """Storage keys the scanner numbers and keys it does not (leading zeros, too long, not decimal), with their
    records written in torch's layout or missing: each path reads each tensor's own record's bytes, or fails
    alike."""
    data_pkl = pickle(dct(*((s(f"t{n}"), tensor_v2(storage_pid("FloatStorage", key, 2), i(0), ints(2), ints(1)))
                            for n, key in enumerate(keys))) + b".")
    records = {f"data/{key}": struct.pack("<2f", n, -n) for n, key in enumerate(sorted(recorded))}
    path = write_raw_archive(tmp_path / f"keys{abs(hash((tuple(keys), tuple(sorted(recorded)))))}.pt", data_pkl,
                             records)
    compiled, python, reference = three_paths(lambda: _read_all(path))
    assert compiled == python == reference
    if isinstance(reference, list):
        assert [data for _, _, data in reference] == [records[record] for record, _, _ in reference]


def test_a_key_the_scanner_does_not_number_is_found_by_its_name(tmp_path: Path) -> None:
    """Key ``07`` (not numbered: -1) beside the record of the last number there can be, ``data/<count - 1>``: the
    tensor reads ``data/07``'s bytes."""
    extras = len(zipfile.ZipFile(write_raw_archive(tmp_path / "none.pt", b"")).namelist())
    last = extras + 2  # the records: the extras, data/07, data/0 and data/<last>
    keys = ["07", "0", str(last)]
    data_pkl = pickle(dct(*((s(f"t{n}"), tensor_v2(storage_pid("FloatStorage", key, 2), i(0), ints(2), ints(1)))
                            for n, key in enumerate(keys))) + b".")
    records = {f"data/{key}": struct.pack("<2f", n + 1, -n) for n, key in enumerate(keys)}
    path = write_raw_archive(tmp_path / "keys.pt", data_pkl, records)
    assert len(zipfile.ZipFile(path).namelist()) == last + 1
    compiled, python, reference = three_paths(lambda: _read_all(path))
    assert compiled == python == reference
    assert [data for _, _, data in compiled] == list(records.values())


@given(st.sampled_from([("H", 0, (1 << 16) - 1), ("I", 0, (1 << 32) - 1), ("i", -(1 << 31), (1 << 31) - 1),
                        ("q", -(1 << 63), (1 << 63) - 1)]).flatmap(
    lambda kind: st.tuples(st.just(kind[0]), st.lists(st.integers(kind[1], kind[2]), max_size=40))))
def test_columns_are_narrowed_to_the_values_they_hold(drawn: tuple[str, list[int]]) -> None:
    """A directory's fields (names' lengths, methods, flags, CRC-32s, record numbers) kept in as many bytes as their
    values need: the same values, whatever their sign or width."""
    code, values = drawn
    narrowed = zip_records._narrowed(array("q", values), code)  # noqa: SLF001
    assert (narrowed.typecode, narrowed.tolist()) == (code, values)
