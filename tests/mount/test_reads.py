"""Tensor files of real mounts against torch: open().read(), cat, dd, np.memmap and a C program."""

from __future__ import annotations

import json
import random
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from corpus import CORPUS_NAMES, CorpusFile, TensorPath, torch_bytes

from mount.helpers import tensor_file

pytestmark = pytest.mark.mount

CHECKSUM_C = r"""
#include <stdint.h>
#include <stdio.h>

/* Prints "<bytes> <FNV-1a 64>" for each file named on the command line. */
int main(int argc, char **argv) {
    static unsigned char buf[1 << 16];
    for (int i = 1; i < argc; i++) {
        FILE *f = fopen(argv[i], "rb");
        if (!f) { perror(argv[i]); return 1; }
        uint64_t hash = 1469598103934665603ULL;
        unsigned long long total = 0;
        size_t n;
        while ((n = fread(buf, 1, sizeof buf, f)) > 0) {
            for (size_t j = 0; j < n; j++) { hash ^= buf[j]; hash *= 1099511628211ULL; }
            total += n;
        }
        if (ferror(f)) { perror(argv[i]); return 1; }
        fclose(f);
        printf("%llu %016llx\n", total, (unsigned long long)hash);
    }
    return 0;
}
"""


def fnv1a(data: bytes) -> str:
    value = 1469598103934665603
    for byte in data:
        value = ((value ^ byte) * 1099511628211) & 0xFFFFFFFFFFFFFFFF
    return f"{value:016x}"


def with_data(entry: CorpusFile) -> dict[TensorPath, torch.Tensor]:
    return {path: t for path, t in entry.expected.tensors.items() if not t.is_meta}


@pytest.mark.parametrize("name", CORPUS_NAMES)
def test_read_and_cat_give_torch_bytes(corpus: dict[str, CorpusFile], corpus_mounts: dict[str, Path],
                                       name: str) -> None:
    mnt = corpus_mounts[name]
    files, expected = [], []
    for path, t in corpus[name].expected.tensors.items():
        f = tensor_file(mnt, path)
        data = b"" if t.is_meta else torch_bytes(t)
        assert f.stat().st_size == len(data), path
        with open(f, "rb") as handle:
            assert handle.read() == data, path
        files.append(f)
        expected.append(data)
    assert subprocess.run(["cat", *files], capture_output=True, check=True).stdout == b"".join(expected)


@pytest.mark.parametrize("name", CORPUS_NAMES)
def test_dd_slices(corpus: dict[str, CorpusFile], corpus_mounts: dict[str, Path], name: str) -> None:
    rng = random.Random(name)
    tensors = with_data(corpus[name])
    for path in rng.sample(sorted(tensors, key=repr), min(6, len(tensors))):
        data = torch_bytes(tensors[path])
        f = tensor_file(corpus_mounts[name], path)
        for block in (1, 8):
            skip, count = rng.randrange(len(data) // block + 2), rng.randrange(1, 6)
            out = subprocess.run(["dd", f"if={f}", f"bs={block}", f"skip={skip}", f"count={count}", "status=none"],
                                 capture_output=True, check=True).stdout
            assert out == data[skip * block : (skip + count) * block], (path, block, skip, count)


def torch_values(t: torch.Tensor) -> np.ndarray | None:
    """What torch gives as numpy values, where it gives any."""
    if t.is_quantized:
        t = t.int_repr()
    try:
        return t.detach().resolve_conj().resolve_neg().numpy()
    except TypeError:
        return None


@pytest.mark.parametrize("name", CORPUS_NAMES)
def test_memmap_with_sidecar_dtype_and_shape(corpus: dict[str, CorpusFile], corpus_mounts: dict[str, Path],
                                             name: str) -> None:
    mapped = 0
    for path, t in with_data(corpus[name]).items():
        f = tensor_file(corpus_mounts[name], path)
        meta = json.loads(Path(f"{f}.json").read_text())
        if meta["numpy_dtype"] is None or meta["nbytes"] == 0:
            continue
        array = np.memmap(f, dtype=np.dtype(meta["numpy_dtype"]), mode="r", shape=tuple(meta["shape"]))
        assert array.tobytes() == torch_bytes(t), path
        values = torch_values(t)
        if values is not None:
            assert np.array_equal(array, values, equal_nan=array.dtype.kind in "fc"), path
        mapped += 1
        del array
    assert mapped > 0


@pytest.fixture(scope="session")
def checksum_program(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("checksum")
    source = directory / "checksum.c"
    source.write_text(CHECKSUM_C)
    program = directory / "checksum"
    subprocess.run(["gcc", "-O2", "-Wall", "-Werror", "-o", str(program), str(source)], check=True)
    return program


def decode_key(key: Any) -> Any:
    if isinstance(key, dict) and list(key) == ["$tuple"]:
        return tuple(decode_key(k) for k in key["$tuple"])
    return key


@pytest.mark.parametrize("name", ["r1_views_containers", "r2_every_dtype", "r2_every_dtype_legacy", "r5_scripted"])
def test_c_program_reads_files_the_index_names(corpus: dict[str, CorpusFile], corpus_mounts: dict[str, Path],
                                               checksum_program: Path, name: str) -> None:
    mnt = corpus_mounts[name]
    index = json.loads((mnt / ".ckptfs" / "index.json").read_text())
    expected = corpus[name].expected.tensors
    listed = [(tuple(decode_key(k) for k in t["path"]), t["file"]) for t in index["tensors"]]
    listed = [(path, file) for path, file in listed if not expected[path].is_meta]
    out = subprocess.run([str(checksum_program), *(str(mnt / file) for _, file in listed)],
                         capture_output=True, text=True, check=True).stdout.splitlines()
    assert len(out) == len(listed) > 0
    for (path, _), line in zip(listed, out):
        data = torch_bytes(expected[path])
        assert line == f"{len(data)} {fnv1a(data)}", path
