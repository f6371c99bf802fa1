"""Opening costs a bounded number of reads and bytes, whatever the checkpoint's data size (issue 13).

A remote source turns each read into a request and holds the file's last
``tail_hint`` bytes from its first one; ``CountingSource`` stands in for it.
"""

from __future__ import annotations

import warnings
import zipfile
from pathlib import Path
from typing import Any

import pytest
import torch
from corpus import CorpusFile, save_zip
from counting import CountingSource
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_zip import local_data_offsets
from torch import nn

import ckptfs
from ckptfs.formats.legacy import FIRST_WINDOW, WINDOW_GROWTH
from ckptfs.formats.prefetch import TAIL_BYTES
from ckptfs.formats.zip_archive import BEFORE_DIRECTORY
from ckptfs.sources import LocalFileSource

REMOTE_TAIL = 1 << 20
"""The suffix a remote source fetches at open."""
LARGE = 64 << 20
COUNTS = (1, 1000, 20000)


def _state(count: int, large: bool) -> dict[str, torch.Tensor]:
    state = {f"layers.{i}.weight": torch.full((4,), float(i)) for i in range(count)}
    if large:
        state["layers.0.weight"] = torch.ones(LARGE // 4)
    return state


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, int, bool], Path]:
    """zip and legacy checkpoints of 1, 1000 and 20000 tensors, each also with its first tensor of 64 MiB."""
    directory = tmp_path_factory.mktemp("open_reads")
    files = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for count in COUNTS:
            for large in (False, True):
                state = _state(count, large)
                for kind, new_zip in (("zip", True), ("legacy", False)):
                    path = directory / f"{kind}_{count}_{int(large)}.pt"
                    torch.save(state, path, _use_new_zipfile_serialization=new_zip)
                    files[(kind, count, large)] = path
        for count, large in ((1, False), (1, True), (1000, False)):
            width = 4096 if large else 2
            module = nn.Sequential(*[nn.Linear(width, width) for _ in range(max(1, count // 2))])
            path = directory / f"torchscript_{count}_{int(large)}.pt"
            torch.jit.script(module).save(str(path))
            files[("torchscript", count, large)] = path
    return files


def _open_counting(path: Path, tail_hint: int) -> tuple[ckptfs.Checkpoint, CountingSource]:
    source = CountingSource(LocalFileSource(path), tail_hint=tail_hint)
    return ckptfs.open(source), source


def _metadata_bytes(path: Path, ck: ckptfs.Checkpoint) -> int:
    """The file's bytes that are not storage data (pickles, headers, directory)."""
    return path.stat().st_size - sum(s.nbytes for s in ck.storages)


def _directory_bytes(path: Path) -> int:
    """The central directory and end records: the part of a zip the tail must hold."""
    with zipfile.ZipFile(path) as archive:
        return path.stat().st_size - archive.start_dir


@pytest.mark.parametrize("tail_hint", [0, REMOTE_TAIL, 4 << 20])
@pytest.mark.parametrize("count", COUNTS)
@pytest.mark.parametrize("large", [False, True])
def test_zip_opens_in_two_reads_when_the_tail_holds_the_directory(
        written: dict[tuple[str, int, bool], Path], count: int, large: bool, tail_hint: int) -> None:
    path = written[("zip", count, large)]
    ck, source = _open_counting(path, tail_hint)
    with ck:
        assert len(ck.tensors) == count
        tail = min(source.size, max(TAIL_BYTES, tail_hint))
        assert source.reads[0] == (source.size - tail, tail)
        directory_fits = _directory_bytes(path) + BEFORE_DIRECTORY <= tail
        expected = 1 if tail == source.size else (2 if directory_fits else 3)
        assert len(source.reads) == expected, source.reads
        assert source.bytes_read <= tail + _metadata_bytes(path, ck) + BEFORE_DIRECTORY


def test_zip_of_20000_tensors_reads_no_more_for_64_mib_of_data(written: dict[tuple[str, int, bool], Path]) -> None:
    """Past the tail, opening reads the pickle's span alone: the same bytes with 64 MiB more data."""
    spans = []
    for large in (False, True):
        ck, source = _open_counting(written[("zip", 20000, large)], 2 << 20)
        with ck:
            assert len(source.reads) == 2
            assert source.reads[0] == (source.size - (2 << 20), 2 << 20)
            spans.append(source.reads[1])
    assert spans[0] == spans[1]
    assert spans[0][0] == 0


@pytest.mark.parametrize("count", COUNTS)
@pytest.mark.parametrize("large", [False, True])
@pytest.mark.parametrize("tail_hint", [0, REMOTE_TAIL])
def test_legacy_opens_in_three_reads(written: dict[tuple[str, int, bool], Path], count: int, large: bool,
                                     tail_hint: int) -> None:
    path = written[("legacy", count, large)]
    ck, source = _open_counting(path, tail_hint)
    with ck:
        assert len(ck.tensors) == count
        assert len(source.reads) <= 3, source.reads
        pickles = _metadata_bytes(path, ck)
        tail = min(source.size, max(TAIL_BYTES, tail_hint))
        assert source.bytes_read <= tail + max(FIRST_WINDOW, WINDOW_GROWTH * pickles)


@pytest.mark.parametrize(("count", "large"), [(1, False), (1, True), (1000, False)])
@pytest.mark.parametrize("tail_hint", [0, REMOTE_TAIL])
def test_torchscript_opens_in_three_reads(written: dict[tuple[str, int, bool], Path], count: int, large: bool,
                                          tail_hint: int) -> None:
    path = written[("torchscript", count, large)]
    ck, source = _open_counting(path, tail_hint)
    with ck:
        assert ck.format == "torchscript"
        tail = min(source.size, max(TAIL_BYTES, tail_hint))
        directory_fits = _directory_bytes(path) + BEFORE_DIRECTORY <= tail
        assert len(source.reads) <= (2 if directory_fits else 3), source.reads
        assert source.bytes_read <= tail + _metadata_bytes(path, ck) + BEFORE_DIRECTORY


def test_first_read_of_a_storage_checks_its_local_header_once(written: dict[tuple[str, int, bool], Path]) -> None:
    path = written[("zip", 1000, False)]
    offsets = local_data_offsets(path)
    ck, source = _open_counting(path, 0)
    with ck:
        tensor = ck.tensor(("layers.7.weight",))
        assert tensor.storage is not None
        source.reads.clear()
        assert ck.read(tensor) == torch.full((4,), 7.0).numpy().tobytes()
        assert ck.read(tensor) == torch.full((4,), 7.0).numpy().tobytes()
        data = offsets[f"{ck.details['archive_prefix']}/{tensor.storage.record}"]
        header, header_length = source.reads[0]
        assert header + header_length == data and header_length < 128
        assert source.reads[1:] == [(data, 16), (data, 16)]


# -- offsets computed without local headers equal those the local headers give -------------------------------


def test_every_corpus_zip_has_its_local_header_offsets(corpus: dict[str, CorpusFile]) -> None:
    checked = 0
    for item in corpus.values():
        if item.format == "legacy":
            continue
        expected = local_data_offsets(item.path)
        ck, source = _open_counting(item.path, 0)
        with ck:
            prefix = ck.details["archive_prefix"]
            assert len(source.reads) <= 3, (item.name, source.reads)
            for storage in ck.storages:
                assert storage.offset == expected[f"{prefix}/{storage.record}"], (item.name, storage.record)
            checked += 1
    assert checked >= 10


@st.composite
def _saved_objects(draw: Any) -> tuple[str, dict[str, torch.Tensor], int]:
    dtypes = [torch.uint8, torch.float16, torch.float32, torch.float64, torch.int64, torch.bool]
    count = draw(st.integers(0, 60))
    sizes = draw(st.lists(st.integers(0, 5000), min_size=count, max_size=count))
    kinds = draw(st.lists(st.sampled_from(dtypes), min_size=count, max_size=count))
    tensors = {draw(st.text("abcxyz._", min_size=1, max_size=40)) + f"{i}": torch.zeros(n, dtype=dtype)
               for i, (n, dtype) in enumerate(zip(sizes, kinds))}
    prefix = draw(st.text("abcdefghij_-", min_size=1, max_size=200))
    alignment = draw(st.sampled_from([64, 64, 128, 4096]))
    return prefix, tensors, alignment


@settings(max_examples=40, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(_saved_objects())
def test_generated_archives_have_their_local_header_offsets(tmp_path: Path,
                                                            saved: tuple[str, dict[str, torch.Tensor], int]) -> None:
    import torch.utils.serialization.config as serialization_config

    prefix, tensors, alignment = saved
    path = tmp_path / f"{prefix}.pt"
    previous = serialization_config.save.storage_alignment
    serialization_config.save.storage_alignment = alignment
    try:
        save_zip({"tensors": tensors, "pad": "x" * len(prefix)}, path)
    finally:
        serialization_config.save.storage_alignment = previous
    expected = local_data_offsets(path)
    ck, source = _open_counting(path, 0)
    with ck:
        assert len(source.reads) <= 3
        for storage in ck.storages:
            assert storage.offset == expected[f"{prefix}/{storage.record}"]
        for tensor in ck.tensors:
            assert ck.read(tensor) == tensors[tensor.path[1]].numpy().tobytes()


@st.composite
def _zip64_layouts(draw: Any) -> tuple[str, list[tuple[str, int]]]:
    """Records of more than 4 GiB among small ones: zip64 sizes, and zip64 offsets for every record after one."""
    before = draw(st.integers(0, 3))
    after = draw(st.integers(0, 3))
    big = draw(st.sampled_from([2**32 - 1, 2**32, 2**32 + 7, 5 * 2**30]))
    sizes = [draw(st.integers(0, 300)) for _ in range(before + after)]
    layout = [(f"s{i}", n) for i, n in enumerate(sizes[:before])] + [("big", big)]
    layout += [(f"s{i}", n) for i, n in enumerate(sizes[before:], before)]
    return draw(st.text("abcdefghij", min_size=1, max_size=120)), layout


@settings(max_examples=8, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(_zip64_layouts())
def test_generated_zip64_archives_have_their_local_header_offsets(
        tmp_path: Path, layout: tuple[str, list[tuple[str, int]]]) -> None:
    from torch._subclasses.fake_tensor import FakeTensorMode

    prefix, records = layout
    path = tmp_path / f"{prefix}.pt"
    with FakeTensorMode():
        tensors = {name: torch.empty(n, dtype=torch.uint8) for name, n in records}
        with torch.serialization.skip_data(materialize_fake_tensors=True):
            save_zip(tensors, path)
    if path.stat().st_blocks * 512 > 2**24:
        pytest.skip("the temporary directory's file system has no sparse files")
    try:
        expected = local_data_offsets(path)
        ck, source = _open_counting(path, 0)
        with ck:
            assert len(source.reads) <= 2
            assert {s.record: s.offset for s in ck.storages} == {
                r.split("/", 1)[1]: o for r, o in expected.items() if "/data/" in r}
            for tensor in ck.tensors:
                ck.read(tensor, 0, min(tensor.nbytes, 16))
    finally:
        path.unlink()
