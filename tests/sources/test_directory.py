"""A directory as a set of sources (``DirectorySource``), and a byte range of a source (``WindowSource``)."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from ckptfs.errors import SourceError
from ckptfs.sources import BytesSource, DirectorySource, SourceSet, WindowSource


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_members_are_the_regular_files(tmp_path: Path) -> None:
    (tmp_path / "b.distcp").write_bytes(b"0123456789")
    (tmp_path / ".metadata").write_bytes(b"xyz")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "inner").write_bytes(b"no")
    os.mkfifo(tmp_path / "fifo")
    directory = DirectorySource(tmp_path)
    assert isinstance(directory, SourceSet)
    assert directory.names() == {".metadata": 3, "b.distcp": 10} and directory.size == 13
    assert directory.stat().mode & 0o170000 == 0o040000
    with pytest.raises(SourceError, match=r"a directory has no bytes of its own"):
        directory.read(0, 1)
    for missing in ("sub", "fifo", "../b.distcp", "nothing"):
        with pytest.raises(SourceError, match=f"no file {missing!r} in the directory"):
            directory.open(missing)
    directory.close()


def test_members_open_once_and_heads_stay_closed(tmp_path: Path) -> None:
    (tmp_path / "a").write_bytes(b"abcdef")
    directory = DirectorySource(tmp_path)
    before = _open_fds()
    assert directory.head("a", 4) == b"abcd" and _open_fds() == before
    source = directory.open("a")
    assert directory.open("a") is source and _open_fds() == before + 1
    assert source.read(2, 3) == b"cde" and directory.head("a", 100) == b"abcdef"
    directory.reopen()
    directory.close()
    assert _open_fds() == before


def test_a_member_that_changed_size_is_refused(tmp_path: Path) -> None:
    (tmp_path / "a").write_bytes(b"abc")
    directory = DirectorySource(tmp_path)
    (tmp_path / "a").write_bytes(b"abcdef")
    with pytest.raises(SourceError, match=r"file 'a' changed size while being opened"):
        directory.open("a")


def test_window() -> None:
    base = BytesSource(b"0123456789", "base")
    window = WindowSource(base, 3, 4)
    assert (window.name, window.size, window.read(0, 4), window.read(1, 2)) == ("base[3:7]", 4, b"3456", b"45")
    assert window.fileno() is None
    with pytest.raises(SourceError, match=r"read of 2 bytes at offset 3 is outside the range \(4 bytes\)"):
        window.read(3, 2)
    with pytest.raises(SourceError, match=r"range \[8, 12\) is outside the file \(10 bytes\)"):
        WindowSource(base, 8, 4)


def test_every_member_can_stay_open_under_a_low_descriptor_limit(tmp_path: Path) -> None:
    """A directory of more files than the soft limit on open files allows: opening it raises the limit (within
    the hard one), so reading every member keeps working."""
    for n in range(300):
        (tmp_path / f"__{n}_0.distcp").write_bytes(b"x" * n)
    script = f"""
import resource
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (64, hard))
from ckptfs.sources import DirectorySource
directory = DirectorySource({str(tmp_path)!r})
assert all(directory.open(name).size == int(name[2:].split("_")[0]) for name in directory.names())
print(resource.getrlimit(resource.RLIMIT_NOFILE)[0])
"""
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    assert int(result.stdout) == (300 + 256 if hard == resource.RLIM_INFINITY else min(300 + 256, hard))


def _descriptors_into(directory: Path) -> int:
    return sum(os.readlink(f"/proc/self/fd/{fd}").startswith(f"{directory}/") for fd in os.listdir("/proc/self/fd")
               if os.path.exists(f"/proc/self/fd/{fd}"))


def test_open_members_are_bounded(tmp_path: Path) -> None:
    """A directory of more files than ``max_open``: every member reads its bytes, in any order and again, with
    at most ``max_open`` of them open; members get no fileno (a descriptor handed out could be closed later)."""
    contents = {f"__{n}_0.distcp": bytes([n]) * (n + 1) for n in range(40)}
    for name, data in contents.items():
        (tmp_path / name).write_bytes(data)
    directory = DirectorySource(tmp_path, max_open=8)
    members = {name: directory.open(name) for name in contents}
    for round_ in range(3):
        for name in sorted(contents, reverse=bool(round_ % 2)):
            assert members[name].read(0, len(contents[name])) == contents[name]
            assert directory.open_count() <= 8 and _descriptors_into(tmp_path) <= 8
    assert directory.open("__3_0.distcp") is members["__3_0.distcp"]
    assert all(member.fileno() is None for member in members.values())
    with pytest.raises(SourceError, match=r"read of 2 bytes at offset 0 is outside the file \(1 bytes\)"):
        members["__0_0.distcp"].read(0, 2)
    (tmp_path / "__5_0.distcp").write_bytes(b"longer now than it was")
    with pytest.raises(SourceError, match=r"file '__5_0.distcp' changed size while being opened"):
        for name in contents:
            members[name].read(0, 1)
    directory.close()
    assert _descriptors_into(tmp_path) == 0


def test_few_members_stay_open_with_their_descriptors(tmp_path: Path) -> None:
    for n in range(4):
        (tmp_path / f"f{n}").write_bytes(b"abc")
    directory = DirectorySource(tmp_path, max_open=4)
    sources = [directory.open(f"f{n}") for n in range(4)]
    assert all(isinstance(source.fileno(), int) for source in sources) and _descriptors_into(tmp_path) == 4
    directory.close()


def test_a_checkpoint_of_more_files_than_may_stay_open(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A DCP directory of 7 files read with room for 2 open members: every tensor's bytes are torch's."""
    torch = pytest.importorskip("torch")
    from dcp_writers import raw_bytes, simulate_ranks

    import ckptfs
    from ckptfs.sources import directory as directory_module

    state = {"w": torch.arange(60.0).reshape(12, 5), "b": torch.arange(6, dtype=torch.int16), "step": 3}
    simulate_ranks(state, {"w": (0, 6), "b": (0, 3)}, tmp_path / "ck", world=6)
    monkeypatch.setattr(directory_module, "MAX_OPEN_MEMBERS", 2)
    with ckptfs.open(tmp_path / "ck") as ck:
        for _ in range(2):
            for name in ("w", "b"):
                tensor = ck.tensor((name,))
                assert ck.read(tensor) == raw_bytes(state[name])
                assert _descriptors_into(tmp_path / "ck") <= 2
    assert _descriptors_into(tmp_path / "ck") == 0


def test_links_out_of_the_directory_are_no_members(tmp_path: Path) -> None:
    """A symbolic link is a member when it leads to a file of the directory itself, never to a file elsewhere
    (``/etc/passwd``, a sibling directory's file, a file in a subdirectory) nor to a directory."""
    directory = tmp_path / "ck"
    (directory / "sub").mkdir(parents=True)
    (directory / "real.distcp").write_bytes(b"0123")
    (directory / "sub" / "deep").write_bytes(b"x")
    (tmp_path / "outside").write_bytes(b"secret")
    for name, target in (("inside.distcp", "real.distcp"), ("passwd.distcp", "/etc/passwd"),
                         ("up.distcp", "../outside"), ("deep.distcp", "sub/deep"), ("dir.distcp", "sub"),
                         ("dangling.distcp", "nothing")):
        (directory / name).symlink_to(target)
    source = DirectorySource(directory)
    assert source.names() == {"inside.distcp": 4, "real.distcp": 4}
    assert source.open("inside.distcp").read(0, 4) == b"0123"
    with pytest.raises(SourceError, match="no file 'passwd.distcp' in the directory"):
        source.open("passwd.distcp")
    source.close()
