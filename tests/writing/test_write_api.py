"""``ckptfs.open(path, mode="r+")`` and ``Checkpoint.write``: skip_data skeletons filled in place, checked by torch."""

from __future__ import annotations

import multiprocessing
import os
import shutil
import threading
import zipfile
from pathlib import Path

import pytest
import torch
from big_endian import save_big_endian
from corpus import crc32_disabled, save_legacy, torch_bytes
from skeletons import assert_crcs_verify, assert_loads_equal, crcs, flat, save_skeleton, sha256, state

import ckptfs
from ckptfs.errors import NotWritableError, WritePastEndError
from ckptfs.sources.memory import BytesSource


def _fill(ck: ckptfs.Checkpoint, source: dict[str, torch.Tensor], chunk: int | None = None) -> None:
    for key, tensor in flat(source).items():
        target = ck.tensor(tuple(key.split(".")))
        if not tensor.is_contiguous():
            continue
        data = torch_bytes(tensor)
        step = chunk or max(len(data), 1)
        for offset in range(0, len(data), step):
            ck.write(target, data[offset : offset + step], offset)


def test_a_skeleton_written_through_the_api_loads_as_the_original(tmp_path: Path) -> None:
    path = save_skeleton(tmp_path / "skel.pt")
    with ckptfs.open(path, mode="r+") as ck:
        _fill(ck, state(), chunk=4000)
    assert_loads_equal(path)
    assert_crcs_verify(path)
    with ckptfs.open(path) as ck:
        assert all(storage.written for storage in ck.storages) and "skip_data" not in ck.details


def test_records_get_their_crc_once_whole_and_not_before(tmp_path: Path) -> None:
    path = save_skeleton(tmp_path / "skel.pt")
    before = crcs(path)
    data = torch_bytes(state()["big"])
    with ckptfs.open(path, mode="r+") as ck:
        big = ck.root["big"]
        ck.write(big, data[: len(data) // 2])
        ck.sync()
        assert crcs(path) == before and big.storage.written is False  # half a record: still unwritten
        ck.write(big, data[len(data) // 2 :], len(data) // 2)
        ck.sync()
        assert big.storage.written is True
        record = big.storage.record
    after = crcs(path)
    assert after[record] == __import__("zlib").crc32(data) != 0
    assert {k: v for k, v in after.items() if k != record} == {k: v for k, v in before.items() if k != record}


def test_out_of_order_and_overlapping_writes_give_the_right_crc(tmp_path: Path) -> None:
    path = save_skeleton(tmp_path / "skel.pt")
    data = torch_bytes(state()["big"])
    pieces = [(offset, data[offset : offset + 70_000]) for offset in range(0, len(data), 50_000)]
    with ckptfs.open(path, mode="r+") as ck:
        for offset, piece in reversed(pieces):
            ck.write(ck.root["big"], piece, offset)
    with zipfile.ZipFile(path) as archive:
        assert archive.read(f"skel/{_record_of(path, 'big')}") == data


def _record_of(path: Path, key: str) -> str:
    with ckptfs.open(path) as ck:
        return ck.root[key].storage.record


def test_threads_writing_ranges_of_one_tensor_and_different_tensors_lose_nothing(tmp_path: Path) -> None:
    path = save_skeleton(tmp_path / "skel.pt")
    source = state()
    with ckptfs.open(path, mode="r+") as ck:
        data = torch_bytes(source["big"])
        jobs = [(ck.root["big"], data, offset) for offset in range(0, len(data), 65536)]
        jobs += [(ck.tensor(tuple(key.split("."))), torch_bytes(t), 0) for key, t in flat(source).items()
                 if key != "big" and t.is_contiguous()]

        def run(part: list) -> None:
            for target, blob, offset in part:
                ck.write(target, blob[offset : offset + 65536] if target is ck.root["big"] else blob, offset)

        threads = [threading.Thread(target=run, args=(jobs[i::4],)) for i in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    assert_loads_equal(path)
    assert_crcs_verify(path)


def test_a_write_past_the_end_changes_nothing(tmp_path: Path) -> None:
    path = save_skeleton(tmp_path / "skel.pt")
    before = sha256(path)
    with ckptfs.open(path, mode="r+") as ck:
        h = ck.root["h"]
        with pytest.raises(WritePastEndError, match=r"a write of 10 bytes at offset 595 runs past the end of tensor "
                                                    r"h \(600 bytes\)"):
            ck.write(h, b"x" * 10, 595)
        with pytest.raises(WritePastEndError):
            ck.write(h, b"x", -1)
    assert sha256(path) == before


def test_read_only_tensors_say_why_and_change_nothing(tmp_path: Path) -> None:
    base = torch.arange(100, dtype=torch.float32)
    path = save_skeleton(tmp_path / "views.pt", {"all": base, "part": base[10:20], "t": base.reshape(10, 10).t(),
                                                 "own": torch.ones(3)})
    before = sha256(path)
    with ckptfs.open(path, mode="r+") as ck:
        with pytest.raises(NotWritableError, match="tensor t is read-only: it is not contiguous"):
            ck.write(ck.root["t"], b"\0" * 4)
        for key in ("all", "part"):
            with pytest.raises(NotWritableError, match=f"tensor {key} is read-only: another tensor views part of"):
                ck.write(ck.root[key], b"\0" * 4)
        ck.write(ck.root["own"], torch_bytes(torch.full((3,), 2.0)))
    assert sha256(path) != before
    assert torch.equal(torch.load(path)["own"], torch.full((3,), 2.0))


def test_tied_references_are_one_tensor(tmp_path: Path) -> None:
    path = save_skeleton(tmp_path / "skel.pt")
    with ckptfs.open(path, mode="r+") as ck:
        assert ck.tensor(("tied",)) is ck.tensor(("w",))
        ck.write(ck.tensor(("tied",)), torch_bytes(state()["w"]))
    loaded = torch.load(path)
    assert torch.equal(loaded["w"], state()["w"]) and torch.equal(loaded["wt"], state()["w"].t())


def _deflated(path: Path) -> Path:
    save_skeleton(tmp := path.with_suffix(".src"))
    with zipfile.ZipFile(tmp) as src, zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as out:
        for info in src.infolist():
            out.writestr(info.filename, src.open(info).read() if info.CRC or not info.file_size else
                         b"\0" * info.file_size)
    return path


def _torchscript(path: Path) -> Path:
    torch.jit.save(torch.jit.script(torch.nn.Linear(2, 2)), path)
    return path


def _legacy(path: Path) -> Path:
    save_legacy({"w": torch.ones(3)}, path)
    return path


def _big_endian(path: Path) -> Path:
    save_big_endian({"w": torch.ones(3)}, path)
    return path


def _dcp(path: Path) -> Path:
    from dcp_writers import save

    save({"w": torch.ones(3)}, path)
    return path / ".metadata"


REFUSED = {
    "big-endian": (_big_endian, "a big-endian archive"),
    "deflated": (_deflated, r"a deflated archive \(re-zipped\)"),
    "torchscript": (_torchscript, "a TorchScript archive"),
    "legacy": (_legacy, r"a legacy \(torch < 1.6\) file"),
    "dcp": (_dcp, "a DCP checkpoint"),
}


@pytest.mark.parametrize("kind", REFUSED)
def test_what_cannot_be_written_in_place_is_refused_naming_why(kind: str, tmp_path: Path) -> None:
    make, reason = REFUSED[kind]
    path = make(tmp_path / kind)
    opened = path.parent if kind == "dcp" else path
    before = sha256(path)
    with pytest.raises(NotWritableError, match=f"^{opened}: cannot be opened for writing: {reason}"):
        ckptfs.open(opened, mode="r+")
    assert sha256(path) == before


def test_bytes_in_memory_are_refused(tmp_path: Path) -> None:
    data = save_skeleton(tmp_path / "skel.pt").read_bytes()
    with pytest.raises(NotWritableError, match="^<bytes>: cannot be opened for writing: not a local file"):
        ckptfs.open(BytesSource(data), mode="r+")


def test_one_writer_at_a_time(tmp_path: Path) -> None:
    path = save_skeleton(tmp_path / "skel.pt")
    with ckptfs.open(path, mode="r+"):
        with pytest.raises(NotWritableError, match=r"already open for writing"):
            ckptfs.open(path, mode="r+")
        with ckptfs.open(path) as reader:  # readers are not kept out
            assert len(reader.tensors) == len(flat(state())) - 1  # tied is w
    ckptfs.open(path, mode="r+").close()


def test_a_read_only_checkpoint_does_not_write(tmp_path: Path) -> None:
    path = save_skeleton(tmp_path / "skel.pt")
    with ckptfs.open(path) as ck, pytest.raises(NotWritableError, match="opened read-only"):
        ck.write(ck.root["h"], b"\0\0")


def _killed_mid_rewrite(path: str, done: multiprocessing.synchronize.Event) -> None:
    ck = ckptfs.open(path, mode="r+")
    ck.write(ck.root["big"], b"\x01" * 1000)  # a whole record, rewritten: its CRC goes to 0 first
    done.set()
    threading.Event().wait()


def test_a_killed_writer_leaves_a_valid_archive_and_a_new_one_finishes(tmp_path: Path) -> None:
    path = save_skeleton(tmp_path / "skel.pt")
    with ckptfs.open(path, mode="r+") as ck:
        _fill(ck, state())
    assert_crcs_verify(path)
    context = multiprocessing.get_context("fork")
    done = context.Event()
    child = context.Process(target=_killed_mid_rewrite, args=(str(path), done))
    child.start()
    assert done.wait(30)
    os.kill(child.pid, 9)
    child.join()
    with ckptfs.open(path) as ck:  # the record being rewritten is marked unwritten (CRC 0), as skip_data marks it
        assert [s.key for s in ck.storages if not s.written] == [ck.root["big"].storage.key]
        record = ck.root["big"].storage.record
    with zipfile.ZipFile(path) as archive:
        assert archive.testzip() == f"skel/{record}"  # the only record whose CRC does not check
    assert torch.load(path, weights_only=True)["big"].flatten()[:250].view(torch.int32).eq(0x01010101).all()
    with ckptfs.open(path, mode="r+") as ck:
        _fill(ck, {"big": state()["big"]})
    assert_loads_equal(path)
    assert_crcs_verify(path)
    with ckptfs.open(path) as ck:
        assert all(s.written for s in ck.storages)


def test_a_file_saved_without_crcs_gets_the_crc_of_each_record_it_writes(tmp_path: Path) -> None:
    with crc32_disabled():
        torch.save(state(), tmp_path / "nocrc.pt")
    path = tmp_path / "nocrc.pt"
    with ckptfs.open(path, mode="r+") as ck:
        ck.write(ck.root["h"], b"\0\0", 4)  # part of a record whose other bytes were always there
    expected = state()
    expected["h"][2] = 0
    assert_loads_equal(path, expected)
    record = _record_of(path, "h")
    assert crcs(path)[record] != 0
    with zipfile.ZipFile(path) as archive:
        archive.open(f"nocrc/{record}").read()  # checks the CRC


def test_a_copy_of_the_skeleton_is_untouched(tmp_path: Path) -> None:
    """Writes go to the file opened, in place: the same inode."""
    path = save_skeleton(tmp_path / "skel.pt")
    shutil.copy(path, tmp_path / "copy.pt")
    inode = path.stat().st_ino
    with ckptfs.open(path, mode="r+") as ck:
        _fill(ck, state())
    assert path.stat().st_ino == inode and sha256(tmp_path / "copy.pt") != sha256(path)
