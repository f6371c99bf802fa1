"""The zip container: lazy opening, data offsets against Python's zipfile, zip64, re-zipped archives."""

from __future__ import annotations

import os
import random
import shutil
import struct
import subprocess
import zipfile
from pathlib import Path
from typing import Iterator

import pytest
import torch
from checks import check_checkpoint
from corpus import CorpusFile, load_expected, r1_views_and_containers, save_zip
from counting import CountingSource

import ckptfs
from ckptfs.errors import NotACheckpointError, UnsupportedError
from ckptfs.formats.zip_archive import predicted_data_offset
from ckptfs.sources import LocalFileSource

TORCH_WRITTEN = ["r1_views_containers", "r2_every_dtype", "r4_skip_data", "r5_scripted", "r5_traced",
                 "r9_no_crc", "r9_align4096", "r9_protocol4"]


def local_data_offsets(path: Path) -> dict[str, int]:
    """Where each record's data starts, from zipfile's central directory and the local header it points to."""
    offsets = {}
    with zipfile.ZipFile(path) as archive, open(path, "rb") as f:
        for info in archive.infolist():
            f.seek(info.header_offset)
            header = struct.unpack(zipfile.structFileHeader, f.read(zipfile.sizeFileHeader))
            assert header[zipfile._FH_SIGNATURE] == zipfile.stringFileHeader
            offsets[info.filename] = (info.header_offset + zipfile.sizeFileHeader
                                      + header[zipfile._FH_FILENAME_LENGTH] + header[zipfile._FH_EXTRA_FIELD_LENGTH])
    return offsets


def assert_storage_offsets_match_zipfile(path: Path) -> ckptfs.Checkpoint:
    expected = local_data_offsets(path)
    ck = ckptfs.open(path)
    prefix = ck.details["archive_prefix"]
    assert ck.storages
    for storage in ck.storages:
        assert storage.offset == expected[f"{prefix}/{storage.record}"], storage.record
    return ck


@pytest.mark.parametrize("name", TORCH_WRITTEN)
def test_storage_offsets_match_local_headers(corpus: dict[str, CorpusFile], name: str) -> None:
    assert_storage_offsets_match_zipfile(corpus[name].path).close()


@pytest.mark.parametrize("name", TORCH_WRITTEN)
def test_alignment_rule_predicts_every_record(corpus: dict[str, CorpusFile], name: str) -> None:
    path = corpus[name].path
    alignment = 4096 if name == "r9_align4096" else 64
    actual = local_data_offsets(path)
    with zipfile.ZipFile(path) as archive:
        for info in archive.infolist():
            name_length = len(info.filename.encode())
            predicted = predicted_data_offset(info.header_offset, name_length, info.file_size, alignment)
            assert predicted == actual[info.filename], info.filename


def test_alignment_4096_is_honoured(corpus: dict[str, CorpusFile]) -> None:
    with ckptfs.open(corpus["r9_align4096"].path) as ck:
        assert ck.details["storage_alignment"] == 4096
        assert all(s.offset % 4096 == 0 for s in ck.storages)


@pytest.mark.parametrize(("filename", "prefix"), [
    ("my.model.v2.pt", "my.model.v2"), ("noext", "noext"), ("x.tar.gz", "x.tar"), ("ünïcode.pt", "archive"),
])
def test_archive_prefix_comes_from_the_archive(tmp_path: Path, filename: str, prefix: str) -> None:
    """torch names the prefix after the file it wrote (spec §1.2); a renamed file keeps it."""
    path = save_zip({"t": torch.arange(3)}, tmp_path / filename)
    moved = path.rename(tmp_path / "renamed.bin")
    with ckptfs.open(moved) as ck:
        assert ck.details["archive_prefix"] == prefix
        assert ck.read(ck.tensor(("t",))) == torch.arange(3).numpy().tobytes()


# -- lazy reads ----------------------------------------------------------------------


def _many_storages(directory: Path, count: int) -> Path:
    tensors = {f"w{i}": torch.full((4096,), i, dtype=torch.int32) for i in range(count)}
    return save_zip(tensors, directory / f"many_{count}.pt")


def _open_counting(path: Path) -> tuple[ckptfs.Checkpoint, CountingSource]:
    source = CountingSource(LocalFileSource(path))
    return ckptfs.open(source), source


def test_open_cost_does_not_grow_with_storage_count(tmp_path: Path) -> None:
    counts = []
    for storages in (16, 256):
        path = _many_storages(tmp_path, storages)
        ck, source = _open_counting(path)
        with ck:
            assert len(ck.storages) == storages
            counts.append(len(source.reads))
            tail = [r for r in source.reads if r[0] + r[1] == source.size]
            assert len(tail) == 1 and tail[0][1] < source.size / 2
            for offset, length in source.reads:
                if (offset, length) in tail:
                    continue
                for s in ck.storages:
                    assert offset + length <= s.offset or offset >= s.offset + s.nbytes, (offset, length, s.key)
    assert counts[0] == counts[1] == 2


def test_contiguous_read_is_one_ranged_read(tmp_path: Path) -> None:
    """The first read of a storage checks its local header once (its data offset was computed at open)."""
    path = _many_storages(tmp_path, 16)
    offsets = local_data_offsets(path)
    ck, source = _open_counting(path)
    with ck:
        tensor = ck.tensor(("w5",))
        record = f"many_16/{tensor.storage.record}"
        header_offset = zipfile.ZipFile(path).getinfo(record).header_offset
        expected = torch.full((4096,), 5, dtype=torch.int32).numpy().tobytes()
        source.reads.clear()
        assert ck.read(tensor, 100, 1000) == expected[100:1100]
        assert source.reads == [(header_offset, offsets[record] - header_offset), (offsets[record] + 100, 1000)]
        source.reads.clear()
        assert ck.read(tensor, 2000, 10) == expected[2000:2010]
        assert source.reads == [(offsets[record] + 2000, 10)]


# -- zip64 -----------------------------------------------------------------------------

ZIP64_SIZE = 5 * 2**30


@pytest.fixture(scope="module")
def zip64_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Spec R12: a 5 GiB record written as a sparse file, costing a few KiB of disk."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    directory = tmp_path_factory.mktemp("zip64")
    probe = directory / "probe"
    with open(probe, "wb") as f:
        f.truncate(ZIP64_SIZE)
    sparse = os.stat(probe).st_blocks * 512 < 2**20
    probe.unlink()
    if not sparse:
        pytest.skip("the temporary directory's file system has no sparse files")
    path = directory / "zip64.pt"
    with FakeTensorMode():
        obj = {"big": torch.empty(ZIP64_SIZE, dtype=torch.uint8), "small": torch.empty(3, dtype=torch.float32),
               "after": torch.empty(2, 4, dtype=torch.int16).t()}
        with torch.serialization.skip_data(materialize_fake_tensors=True):
            torch.save(obj, path)
    assert os.stat(path).st_blocks * 512 < 2**20
    yield path
    path.unlink()


def test_zip64_offsets_and_reads(zip64_checkpoint: Path) -> None:
    offsets = local_data_offsets(zip64_checkpoint)
    assert max(offsets.values()) > 2**32
    small = torch.tensor([1.5, -2.0, 3.25]).numpy().tobytes()
    after = torch.arange(8, dtype=torch.int16).numpy().tobytes()
    # Complete the skipped data in place, as spec §5 describes.
    with open(zip64_checkpoint, "r+b") as f:
        for record, data in (("zip64/data/1", small), ("zip64/data/2", after)):
            f.seek(offsets[record])
            f.write(data)
    with assert_storage_offsets_match_zipfile(zip64_checkpoint) as ck:
        big = ck.tensor(("big",))
        assert (big.shape, big.nbytes) == ((ZIP64_SIZE,), ZIP64_SIZE)
        assert ck.read(big, ZIP64_SIZE - 5) == bytes(5)
        assert ck.read(ck.tensor(("small",))) == small
        transposed = ck.tensor(("after",))
        assert transposed.stride == (1, 4)
        expected = torch.arange(8, dtype=torch.int16).reshape(2, 4).t().contiguous()
        assert ck.read(transposed) == expected.numpy().tobytes()


def test_zip64_opens_in_two_reads_without_local_headers(zip64_checkpoint: Path) -> None:
    ck, source = _open_counting(zip64_checkpoint)
    with ck:
        assert len(source.reads) == 2, source.reads
        offsets = local_data_offsets(zip64_checkpoint)
        assert {s.record: s.offset for s in ck.storages} == {r.split("/", 1)[1]: o for r, o in offsets.items()
                                                             if "/data/" in r}



def _directory_shuffled(source: Path, target: Path, seed: int) -> Path:
    """The same bytes with the central directory's entries in another order than the records they describe (the
    end records, torch's zip64 one too, stay true: same count, size and offset)."""
    raw = source.read_bytes()
    eocd = raw.rindex(b"PK\x05\x06")
    count, size, offset = struct.unpack_from("<HII", raw, eocd + 10)
    entries, pos = [], offset
    for _ in range(count):
        name_length, extra_length, comment_length = struct.unpack_from("<HHH", raw, pos + 28)
        end = pos + 46 + name_length + extra_length + comment_length
        entries.append(raw[pos:end])
        pos = end
    assert pos == offset + size
    shuffled = entries[:]
    while shuffled == entries:
        random.Random(seed).shuffle(shuffled)
        seed += 1
    target.write_bytes(raw[:offset] + b"".join(shuffled) + raw[offset + size :])
    return target


def test_directory_in_another_order_than_the_records(tmp_path: Path) -> None:
    """Each record's successor (which bounds its data) is found by offset, not by directory order."""
    source = _many_storages(tmp_path, 16)
    path = _directory_shuffled(source, tmp_path / "shuffled.pt", seed=16)
    ck, counting = _open_counting(path)
    with ck:
        assert len(counting.reads) == 2, counting.reads  # offsets still computed, no local header read
        assert {t.path: ck.read(t) for t in ck} == {(f"w{i}",): torch.full((4096,), i, dtype=torch.int32)
                                                    .numpy().tobytes() for i in range(16)}
    assert_storage_offsets_match_zipfile(path).close()


# -- archives re-zipped by other tools ---------------------------------------------------


def _rezip(source: Path, target: Path, *, method: int, prefix: str, directory_entry: bool = False,
           reverse: bool = False) -> Path:
    with zipfile.ZipFile(source) as zin, zipfile.ZipFile(target, "w", compression=method) as zout:
        if directory_entry:
            zout.writestr(zipfile.ZipInfo(f"{prefix}/"), b"")
        names = zin.namelist()[::-1] if reverse else zin.namelist()
        for name in names:
            zout.writestr(f"{prefix}/{name.split('/', 1)[1]}", zin.read(name))
    return target


def _zip_tool(source: Path, target: Path, *, stored: bool) -> Path:
    """Re-packs with Info-ZIP's ``zip``: directory entries, extra fields that differ from the central directory."""
    work = target.parent / f"{target.stem}_tree"
    with zipfile.ZipFile(source) as zin:
        zin.extractall(work)
    (prefix,) = os.listdir(work)
    shutil.move(work / prefix, work / "repacked")
    subprocess.run(["zip", "-q", "-r", *(["-0"] if stored else []), str(target), "repacked"], cwd=work, check=True)
    return target


REZIPS = {
    "stored_renamed": lambda s, t: _rezip(s, t, method=zipfile.ZIP_STORED, prefix="other"),
    "deflated_same_prefix": lambda s, t: _rezip(s, t, method=zipfile.ZIP_DEFLATED, prefix=s.stem),
    "deflated_directory_entry": lambda s, t: _rezip(s, t, method=zipfile.ZIP_DEFLATED, prefix="renamed",
                                                    directory_entry=True),
    "stored_reversed": lambda s, t: _rezip(s, t, method=zipfile.ZIP_STORED, prefix="rev", reverse=True),
    "zip_tool_deflated": lambda s, t: _zip_tool(s, t, stored=False),
    "zip_tool_stored": lambda s, t: _zip_tool(s, t, stored=True),
}


@pytest.fixture(scope="module")
def r1_original(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, object]:
    obj = r1_views_and_containers(torch.Generator().manual_seed(7))
    return save_zip(obj, tmp_path_factory.mktemp("rezip") / "r1.pt"), obj


@pytest.mark.parametrize("variant", REZIPS)
def test_rezipped_archive_reads_like_torch(tmp_path: Path, r1_original: tuple[Path, object], variant: str) -> None:
    if variant.startswith("zip_tool") and shutil.which("zip") is None:
        pytest.skip("Info-ZIP zip is not installed")
    source, obj = r1_original
    path = REZIPS[variant](source, tmp_path / f"{variant}.pt")
    check_checkpoint(path, load_expected(path, obj), random.Random(variant))
    assert_storage_offsets_match_zipfile(path).close()


def test_bzip2_rezip_is_unsupported(tmp_path: Path, r1_original: tuple[Path, object]) -> None:
    path = _rezip(r1_original[0], tmp_path / "bz.pt", method=zipfile.ZIP_BZIP2, prefix="bz")
    with pytest.raises(UnsupportedError, match="'bz/data.pkl' uses compression method 12") as info:
        ckptfs.open(path)
    assert str(path) in str(info.value)


def test_two_level_prefix_is_not_a_checkpoint(tmp_path: Path, r1_original: tuple[Path, object]) -> None:
    """Like torch, only one path component is stripped (spec §1.2)."""
    path = _rezip(r1_original[0], tmp_path / "deep.pt", method=zipfile.ZIP_STORED, prefix="a/basic")
    reason = r"a zip archive, but not a torch.save checkpoint \(no data.pkl\)$"
    with pytest.raises(NotACheckpointError, match=reason) as info:
        ckptfs.open(path)
    assert str(path) in str(info.value)


@pytest.mark.parametrize("compiled", [True, False])
def test_empty_storage_met_under_two_dtypes_and_the_offsets_after_it(tmp_path: Path, compiled: bool,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """A zero-byte storage referenced as float32 and as int32 is two storages (an alias): every storage's data offset
    is still its own record's, on both parse paths."""
    from ckptfs.pickle import cscan

    monkeypatch.setattr(cscan, "ENABLED", compiled and cscan.ENABLED)
    empty = torch.empty(0)
    values = {"a": torch.tensor([1.5, 2.5]), "e": empty, "f": empty.view(torch.int32),
              "b": torch.arange(5, dtype=torch.int64), "c": torch.tensor([7.0], dtype=torch.float64)}
    path = save_zip(values, tmp_path / "alias.pt")
    offsets = local_data_offsets(path)
    with ckptfs.open(path) as ck:
        assert len(ck.storages) == 5
        assert {s.dtype.name for s in ck.storages if s.base is not None} == {"int32"}
        for storage in ck.storages:
            record = ck.details["archive_prefix"] + "/" + storage.record
            assert storage.offset == offsets[record]
        for key, tensor in values.items():
            assert ck.read(ck.tensor((key,))) == tensor.numpy().tobytes()


@pytest.mark.parametrize("name", ["r1_views_containers", "r5_scripted", "r9_no_crc", "r9_align4096"])
def test_records_kept_after_opening_are_the_directory_s(corpus: dict[str, CorpusFile], name: str) -> None:
    """After opening, each storage's record (kept as a row, made when asked for) and every other record have the
    central directory's fields and their local header's data offset; a name no record has is not found."""
    path = corpus[name].path
    offsets = local_data_offsets(path)
    with zipfile.ZipFile(path) as archive:
        infos = {info.filename: info for info in archive.infolist()}
    with ckptfs.open(path) as ck:
        records = ck._reader.parsed.archive.entries  # type: ignore[attr-defined]
        names = [f"{ck.details['archive_prefix']}/{storage.record}" for storage in ck.storages]
        others = [n for n in infos if n not in names and (n.endswith(".pkl") or n.endswith("version"))]
        assert names and others
        for record in names + others:
            info, made, kept = infos[record], records.get(record), records[record]
            assert record in records
            assert made is not kept or record in others
            for entry in (made, kept):
                assert (entry.name, entry.method, entry.compressed_size, entry.size, entry.header_offset,
                        entry.crc) == (record, info.compress_type, info.compress_size, info.file_size,
                                       info.header_offset, info.CRC)
                assert entry.data_offset == offsets[record]
            assert records[record] is kept
        assert records.get(names[0] + "0") is None and names[0] + "0" not in records
        with pytest.raises(KeyError):
            records[names[0] + "0"]
