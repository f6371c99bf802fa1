"""scripts/bench's C listing floors (``listing.c``, ``listing_ll.c``): each shows exactly the tree its entries file
names, nested directories included, in that order, with those sizes (issue 24's ``--nest`` figures are ratios
against them, so a floor that lists less would flatter ckptfs)."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from mount.helpers import force_unmount, mount_points, wait_until

BENCH_LIB = Path(__file__).resolve().parents[2] / "scripts" / "bench_lib"

pytestmark = pytest.mark.mount


def _entries() -> list[str]:
    """A tree of ``KIND SIZE PATH`` lines: a directory far longer than one readdir reply, nesting three deep, a file
    named like a directory's own entries, empty directories."""
    lines = ["d 0 .ckptfs", "f 120 model.safetensors", "d 0 model"]
    for layer in range(3):
        lines.append(f"d 0 model/{layer}")
        lines += [f"f {expert * 7 + layer} model/{layer}/w{expert}.weight" for expert in range(400 if layer == 1 else 3)]
        lines.append(f"d 0 model/{layer}/empty")
    lines += ["f 5 model/model", "f 0 top"]
    return lines


@pytest.fixture(scope="module")
def floors(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    if shutil.which("gcc") is None or shutil.which("pkg-config") is None:
        pytest.fail("the C floors need gcc and pkg-config (scripts/setup installs them)")
    out = tmp_path_factory.mktemp("floors")
    flags = subprocess.run(["pkg-config", "--cflags", "--libs", "fuse3"], capture_output=True, text=True,
                           check=True).stdout.split()
    built = {}
    for name in ("listing", "listing_ll"):
        built[name] = out / name
        subprocess.run(["gcc", "-O2", "-Wall", "-Werror", str(BENCH_LIB / f"{name}.c"), *flags, "-o",
                        str(built[name])], check=True)
    return built


@pytest.fixture
def mounted(request: pytest.FixtureRequest, floors: dict[str, Path], tmp_path: Path) -> Iterator[Path]:
    entries = tmp_path / "entries.txt"
    entries.write_text("".join(line + "\n" for line in _entries()))
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    subprocess.run([str(floors[request.param]), str(entries), str(mnt), "-o", "ro"], check=True, timeout=30)
    try:
        wait_until(lambda: str(mnt) in mount_points())
        yield mnt
    finally:
        force_unmount(mnt)


@pytest.mark.parametrize("mounted", ["listing", "listing_ll"], indirect=True)
def test_a_floor_shows_its_nested_tree_in_order(mounted: Path) -> None:
    shown = subprocess.run(["find", str(mounted), "-mindepth", "1", "-printf", "%y %s %P\n"], capture_output=True,
                           text=True, check=True).stdout.splitlines()
    assert shown == _entries()
    assert sorted(os.listdir(mounted / "model" / "1")) == sorted([f"w{e}.weight" for e in range(400)] + ["empty"])
    assert (mounted / "model" / "0" / "w2.weight").stat().st_size == 14
    assert not (mounted / "model" / "0" / "w3.weight").exists()
    assert os.listdir(mounted / "model" / "2" / "empty") == []
