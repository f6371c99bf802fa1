"""The compiled scanner of torch.save zip pickles (``ckptfs/pickle/_cscan.c``) against the pure-Python paths.

Every input gives the same result on the three paths: compiled (where it accepts), the pure-Python fast paths and
the reference (``CKPTFS_PICKLE_FAST_PATHS=0``): the same ``info --json`` text, or the same error by type and
message. The inputs: torch-written checkpoints of the forms the scanner accepts, the corpus, every hostile case,
the hostile seeds, mutants of all of them (as the fuzzer makes them), and random opcode streams around tensor
records under small limits. Then the scanner alone, under AddressSanitizer and UBSan (``cscan_fuzz.c``).
"""

from __future__ import annotations

import collections
import io
import random
import shutil
import struct
import subprocess
import zipfile
from pathlib import Path
from typing import Any, Iterator

import pytest
import torch
from corpus import CORPUS_NAMES, CorpusFile
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from ckptfs.limits import Limits
from ckptfs.pickle import cscan
from ckptfs.sources import BytesSource
from hostile import test_cscan_dcp
from hostile.cases import CASES, Case
from hostile.checks import compiled_scanner, three_paths
from hostile.fuzz_target import Mutator
from hostile.picklegen import dct, get, glob, i, ints, pickle, put, s, storage_pid, tensor_v2
from hostile.seeds import SEED_NAMES
from hostile.test_parse_paths import opened

HERE = Path(__file__).resolve().parent
MUTANTS = 600
FUZZ_ITERATIONS = 200_000


@pytest.fixture
def accepted(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many scans the compiled scanner accepted (one entry per accepted pickle)."""
    made: list[int] = []
    scan = cscan.scan

    def counted(data: bytes, limits: Limits) -> cscan.Scan | None:
        result = scan(data, limits)
        if result is not None:
            made.append(len(result.items) // cscan.ITEM_FIELDS)
        return result

    monkeypatch.setattr(cscan, "scan", counted)
    return made


def _tied() -> dict[str, torch.Tensor]:
    base = torch.arange(12, dtype=torch.float32)
    return {"embed": base.view(3, 4), "head": base.view(3, 4), "view": base[2:8].view(2, 3), "again": base.view(3, 4),
            "t": base.view(3, 4).t()}


def torch_written() -> dict[str, Any]:
    """State dicts of every form the scanner accepts, as torch writes them."""
    gen = torch.Generator().manual_seed(24)
    model = nn.Sequential(nn.Linear(4, 3), nn.LayerNorm(3), nn.Linear(3, 2))
    return {
        "state_dict": model.state_dict(),
        "plain": {"a": torch.randn(3, generator=gen), "b": torch.randn(2, 2, generator=gen).t()},
        "ordered": collections.OrderedDict(a=torch.ones(3), b=torch.zeros(1, 0)),
        "tied": _tied(),
        "empty": {},
        "empty_tensors": {"z": torch.empty(0, 3), "e": torch.empty(0, dtype=torch.bfloat16)},
        "requires_grad": {"p": torch.ones(2, requires_grad=True)},
        "dtypes": {str(d): torch.ones(3, dtype=d) for d in (torch.float16, torch.bfloat16, torch.int8, torch.bool,
                                                             torch.complex64, torch.float64, torch.uint8, torch.int64)},
        "batches": {f"layer.{n}.weight": torch.full((2,), float(n)) for n in range(2003)},
        "unicode_keys": {"gewicht.ä": torch.ones(1), "🙂": torch.zeros(2)},
        "big_numbers": {"wide": torch.empty(70000, 1).as_strided((70000, 1), (1, 70000))},
        # Forms the scanner leaves to the interpreter: an untyped storage (_rebuild_tensor_v3), a value other than a
        # tensor.
        "float8": {"f8": torch.ones(3, dtype=torch.float8_e4m3fn)},
        "mixed": {"w": torch.ones(2), "epoch": 3},
    }


NOT_SCANNED = ("float8", "mixed")


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("cscan")
    paths = {}
    for name, value in torch_written().items():
        paths[name] = out / f"{name}.pt"
        torch.save(value, paths[name])
    return paths


def data_pkl(archive: bytes) -> bytes:
    with zipfile.ZipFile(io.BytesIO(archive)) as z:
        return z.read(next(n for n in z.namelist() if n.endswith("/data.pkl")))


def test_the_scanner_is_built_where_there_is_a_compiler() -> None:
    """``pip install`` (``scripts/setup``) builds it when gcc is there: else every comparison here is of one path."""
    assert shutil.which("gcc"), "gcc is needed (scripts/setup installs it)"
    assert cscan.LIBRARY is not None, f"{cscan.PATH_NAME}: run scripts/setup (pip install -e . builds it)"
    assert cscan.active_path().startswith("compiled (_cscan.")


def test_torch_written_forms_are_scanned_and_same_on_every_path(written: dict[str, Path], accepted: list[int]) -> None:
    for name, path in written.items():
        compiled, python, reference = three_paths(lambda path=path: opened(path))
        assert isinstance(compiled, str), (name, compiled)
        assert compiled == python == reference, name
    scanned = [name for name in written if name not in NOT_SCANNED]
    assert len(accepted) == len(scanned)
    assert accepted[scanned.index("tied")] == len(torch_written()["tied"])


@pytest.mark.parametrize("name", CORPUS_NAMES)
def test_corpus_same_on_every_path(corpus: dict[str, CorpusFile], name: str) -> None:
    compiled, python, reference = three_paths(lambda: opened(corpus[name].path))
    assert isinstance(compiled, str)
    assert compiled == python == reference


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_hostile_case_same_on_every_path(case: Case, hostile_files: dict[str, Path]) -> None:
    compiled, python, reference = three_paths(lambda: opened(hostile_files[case.name]))
    assert compiled == python == reference


def test_mutants_same_on_every_path(written: dict[str, Path], seeds: dict[str, bytes], accepted: list[int]) -> None:
    sources = [path.read_bytes() for path in written.values() if path.stat().st_size < 200_000]
    sources += [seeds[name] for name in SEED_NAMES]
    mutate = Mutator(sources, random.Random(24))
    outcomes = set()
    for _ in range(MUTANTS):
        data = mutate()
        compiled, python, reference = three_paths(lambda data=data: opened(BytesSource(data, "fuzz.pt")))
        assert compiled == python == reference
        outcomes.add(compiled[0] if isinstance(compiled, tuple) else "opened")
    assert {"opened", "UnpicklingError", "CorruptCheckpointError"} <= outcomes
    if cscan.LIBRARY is not None:
        assert len(accepted) >= MUTANTS // 30


# -- random opcode streams around tensor records, in a zip with their storage records ---------------------------

_FLOAT = glob("torch", "FloatStorage")
_REBUILD = glob("torch._utils", "_rebuild_tensor_v2")
SNIPPETS = [
    b"(", b")", b"}", b"N", b"\x88", b"\x89", b"K\x02", b"M\x01\x00", b"J\xff\xff\xff\xff", b"\x8a\x01\x05",
    b"\x8a\x09" + bytes(9), s("k"), s("0"), b"\x8c\x01\xff", b"X\x02\x00\x00\x00\xc3\xa4", b"\x94", put(0), put(5),
    get(0), get(1), get(3), b"t", b"\x85", b"\x86", b"\x87", b"u", b"s", b"b", b"R", b"Q", _REBUILD, _FLOAT,
    glob("collections", "OrderedDict"), glob("torch", "UntypedStorage"), glob("torch", "Nope"),
    storage_pid("FloatStorage", "0", 4), storage_pid("FloatStorage", "1", 2), storage_pid("HalfStorage", "0", 8),
    storage_pid("FloatStorage", "2", 4), tensor_v2(storage_pid("FloatStorage", "0", 4), i(0), ints(4), ints(1)),
    tensor_v2(storage_pid("FloatStorage", "0", 4), i(1), ints(2, 2), ints(1, 1)),
    tensor_v2(storage_pid("FloatStorage", "1", 2), i(0), ints(4), ints(1)),
]
"""Opcodes the scanner reads, names it knows and does not, and whole persistent ids and tensor records."""


def zipped(pickle_bytes: bytes) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as z:
        z.writestr("archive/data.pkl", pickle_bytes)
        z.writestr("archive/data/0", bytes(16))
        z.writestr("archive/data/1", bytes(8))
    return buffer.getvalue()


@settings(max_examples=500, deadline=None)
@given(head=st.sampled_from([b"}", b"}q\x00(", glob("collections", "OrderedDict") + b")R(", b""]),
       parts=st.lists(st.sampled_from(SNIPPETS), max_size=30), stop=st.sampled_from([b"u.", b".", b"s.", b"ub."]),
       depth=st.sampled_from([10_000_000, 16, 18, 24]), memo=st.sampled_from([10_000_000, 16, 18, 30]))
def test_random_streams_same_on_every_path(head: bytes, parts: list[bytes], stop: bytes, depth: int,
                                           memo: int) -> None:
    archive = zipped(pickle(head + b"".join(parts) + stop))
    limits = Limits(max_stack_depth=depth, max_memo_entries=memo)

    def make() -> Any:
        return opened(BytesSource(archive, "stream.pt"), limits)

    compiled, python, reference = three_paths(make)
    assert compiled == python == reference


RECORD = st.builds(
    lambda cls, key, numel, location, offset, size, stride: tensor_v2(storage_pid(cls, key, numel, location), i(offset),
                                                                       ints(*size), ints(*stride)),
    cls=st.sampled_from(["FloatStorage", "FloatStorage", "HalfStorage", "LongStorage", "UntypedStorage",
                         "QUInt4x2Storage", "NoSuchStorage"]),
    key=st.sampled_from(["0", "0", "1", "2", "3"]), numel=st.sampled_from([0, 1, 2, 4, 8, 16]),
    location=st.sampled_from(["cpu", "cuda:0", "a b"]), offset=st.sampled_from([0, 0, 1, 3, 70000, -1]),
    size=st.lists(st.sampled_from([0, 1, 2, 4, 300]), max_size=3),
    stride=st.lists(st.sampled_from([0, 1, 2, 4]), max_size=3))
"""Tensor records as torch writes them, of storages that exist, share keys under other classes or sizes, are missing
(``3``), and views that fit their storage or not: most are scanned, and the rows must make what the opcodes make."""


def near_valid_archive(items: list[tuple[str, bytes]]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as z:
        z.writestr("archive/data.pkl", pickle(dct(*((s(key), record) for key, record in items)) + b"."))
        for key, size in (("0", 16), ("1", 8), ("2", 32)):
            z.writestr(f"archive/data/{key}", bytes(size))
    return buffer.getvalue()


@settings(max_examples=400, deadline=None)
@given(items=st.lists(st.tuples(st.sampled_from(["a", "b", "w.0", "\u00e4", "c"]), RECORD), max_size=6))
def test_torch_like_records_same_on_every_path(items: list[tuple[str, bytes]]) -> None:
    archive = near_valid_archive(items)
    compiled, python, reference = three_paths(lambda: opened(BytesSource(archive, "records.pt")))
    assert compiled == python == reference


def test_torch_like_records_are_scanned() -> None:
    """The records above are the scanner's: a dict of two of them is accepted (the comparison is of its rows)."""
    record = tensor_v2(storage_pid("FloatStorage", "0", 4), i(0), ints(2, 2), ints(2, 1))
    data = data_pkl(near_valid_archive([("a", record), ("b", record)]))
    rows = cscan.scan(data, Limits())
    assert rows is not None
    assert (len(rows.items), len(rows.tensors)) == (2 * cscan.ITEM_FIELDS, 2 * cscan.TENSOR_FIELDS)


def test_limits_near_a_checkpoint_are_reported_as_the_reference_reports_them(written: dict[str, Path]) -> None:
    """Every memo and stack bound around what the state dict needs: the scanner refuses before any bound."""
    archive = written["state_dict"].read_bytes()
    for depth in range(1, 24):
        for memo in (1, 8, 16, 24, 30, 31, 32, 33, 40, 10_000_000):
            limits = Limits(max_stack_depth=depth, max_memo_entries=memo)
            compiled, python, reference = three_paths(
                lambda limits=limits: opened(BytesSource(archive, "sd.pt"), limits))
            assert compiled == python == reference


def test_pure_python_when_the_library_is_missing(written: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    with compiled_scanner(True):
        built = opened(written["tied"])
    monkeypatch.setattr(cscan, "LIBRARY", None)
    assert cscan.scan(data_pkl(written["tied"].read_bytes()), Limits()) is None
    assert opened(written["tied"]) == built


# -- the scanner alone under AddressSanitizer and UBSan ---------------------------------------------------------


def fuzz_seeds(written: dict[str, Path], seeds: dict[str, bytes], hostile_files: dict[str, Path],
               out: Path) -> Iterator[Path]:
    """The pickles: torch's, the hostile seeds' (a legacy file starts with its pickle) and the hostile zips'; the
    central directories of torch's archives."""
    pickles = {f"torch_{name}": data_pkl(path.read_bytes()) for name, path in written.items()
               if path.stat().st_size < 200_000}
    for name in ("state_dict", "tied", "dtypes", "unicode_keys"):
        pickles[f"directory_{name}"] = central_directory(written[name].read_bytes())
    for name in SEED_NAMES:
        pickles[f"seed_{name}"] = data_pkl(seeds[name]) if zipfile.is_zipfile(io.BytesIO(seeds[name])) else seeds[name]
    for name, path in hostile_files.items():
        if path.is_file() and path.stat().st_size < 1 << 20 and zipfile.is_zipfile(path):
            stored = _stored_data_pkl(path)
            if stored is not None:
                pickles[f"case_{name}"] = stored
    for name, data in pickles.items():
        (out / name).write_bytes(data)
        yield out / name


def dcp_fuzz_seeds(hostile_files: dict[str, Path], written: Path, out: Path) -> Iterator[Path]:
    """DCP ``.metadata`` pickles: torch's (``dcp_torch_*``, which the DCP scanner accepts) and the hostile DCP
    cases'."""
    for name, directory in test_cscan_dcp.torch_written(written).items():
        shutil.copyfile(directory / ".metadata", out / f"dcp_torch_{name}")
        yield out / f"dcp_torch_{name}"
    for name, path in hostile_files.items():
        metadata = path / ".metadata"
        if path.is_dir() and metadata.is_file() and metadata.stat().st_size < 1 << 20:
            shutil.copyfile(metadata, out / f"case_dcp_{name}")
            yield out / f"case_dcp_{name}"


def central_directory(archive: bytes) -> bytes:
    end = archive.rindex(b"PK\x05\x06")
    size, offset = struct.unpack_from("<II", archive, end + 12)
    return archive[offset : offset + size]


def _stored_data_pkl(path: Path) -> bytes | None:
    """A hostile zip's data.pkl when it is stored (not deflated: no bombs) and the zipfile module reads it."""
    try:
        with zipfile.ZipFile(path) as z:
            info = next((n for n in z.infolist() if n.filename.endswith("/data.pkl")), None)
            if info is None or info.compress_type != zipfile.ZIP_STORED or info.file_size > 1 << 20:
                return None
            return z.read(info)
    except Exception:  # noqa: BLE001  (a hostile zip may make the zipfile module raise anything: no seed then)
        return None


def test_scanner_fuzzed_under_sanitizers(written: dict[str, Path], seeds: dict[str, bytes],
                                         hostile_files: dict[str, Path], tmp_path: Path) -> None:
    gcc = shutil.which("gcc")
    assert gcc, "gcc is needed (scripts/setup --test installs it)"
    driver = tmp_path / "cscan_fuzz"
    sources = HERE.parents[1] / "ckptfs" / "pickle"
    built = subprocess.run([gcc, "-std=c11", "-g", "-O1", "-fsanitize=address,undefined", "-fno-sanitize-recover=all",
                            "-fno-omit-frame-pointer", "-o", str(driver), str(HERE / "cscan_fuzz.c"),
                            *(str(sources / name) for name in ("_cscan.c", "_cscan_zip.c", "_cscan_dcp.c",
                                                                 "_cscan_dcp_objects.c", "_cscan_dcp_join.c"))],
                           capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stderr
    (tmp_path / "seeds").mkdir()
    files = list(fuzz_seeds(written, seeds, hostile_files, tmp_path / "seeds"))
    dcp = list(dcp_fuzz_seeds(hostile_files, tmp_path / "dcp", tmp_path / "seeds"))
    files += dcp
    directories = sum(f.name.startswith(("directory_", "dcp_torch_")) for f in files)
    scannable = sum(f.name.startswith("torch_") and f.name[len("torch_"):] not in NOT_SCANNED for f in files)
    run = subprocess.run([str(driver), str(FUZZ_ITERATIONS), *map(str, files)], capture_output=True, text=True,
                         timeout=1200)
    assert (run.returncode, run.stderr) == (0, "")
    seeds_line, mutants_line = run.stdout.strip().split("; ")
    assert seeds_line.startswith(f"seeds {len(files)} accepted ")
    assert int(seeds_line.rsplit(" ", 1)[1]) >= scannable + directories
    assert mutants_line.startswith(f"mutants {FUZZ_ITERATIONS} accepted ")
    assert int(mutants_line.rsplit(" ", 1)[1]) > FUZZ_ITERATIONS // 400
