"""The fused tensor record: used for torch's state dicts, and never changing a result or an error."""

from __future__ import annotations

import io
import json
import re
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import torch
from corpus import save_legacy, save_zip, write_raw_archive
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ckptfs
from ckptfs import CkptfsError
from ckptfs.fs.describe import encode_tree
from ckptfs.pickle import tensor_record

NEVER = re.compile(rb"(?!)")


@contextmanager
def fusion(enabled: bool) -> Iterator[list[bool]]:
    """Fusion on or off; yields the outcome of every fused attempt."""
    attempts: list[bool] = []
    real = tensor_record.apply

    def counting(u: Any, match: Any) -> bool:
        attempts.append(real(u, match))
        return attempts[-1]

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(tensor_record, "apply", counting)
        if not enabled:
            patch.setattr(tensor_record, "PATTERN", NEVER)
        yield attempts


def outcome(path: Path, enabled: bool) -> tuple[Any, list[bool]]:
    """What opening gives: the whole tree as JSON (tensor metadata included), or the error's type and text."""
    with fusion(enabled) as attempts:
        try:
            with ckptfs.open(path) as ck:
                return ("tree", json.dumps(encode_tree(ck.root))), attempts
        except CkptfsError as exc:
            return ("error", type(exc).__name__, str(exc)), attempts


def state_dict(count: int) -> dict[str, Any]:
    """Every form the record takes: dtypes, ranks 0-5, offsets past 255 and 65535, memo past 255."""
    base = torch.arange(70_000, dtype=torch.float32)
    dtypes = [torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.uint8, torch.bool, torch.complex64]
    shapes = [(), (3,), (2, 3), (2, 1, 3), (1, 2, 1, 3), (1, 1, 1, 2, 3)]
    out: dict[str, Any] = {}
    for n in range(count):
        dtype = dtypes[n % len(dtypes)]
        tensor = torch.zeros(shapes[n % len(shapes)], dtype=dtype)
        out[f"layer.{n}.weight"] = tensor.requires_grad_(n % 5 == 0 and dtype.is_floating_point)
    out["offset.small"] = base[300:306].view(2, 3)
    out["offset.large"] = base[66_000:66_006].view(3, 2)
    out["strided"] = base[:12].view(3, 4).t()
    out["param"] = torch.nn.Parameter(torch.ones(2, 2))
    return out


@pytest.mark.parametrize("save", [save_zip, save_legacy], ids=["zip", "legacy"])
def test_torch_state_dicts_are_fused_with_the_same_result(save: Any, tmp_path: Path) -> None:
    path = save(state_dict(300), tmp_path / "sd.pt")
    fused, attempts = outcome(path, True)
    plain, none = outcome(path, False)
    assert fused[0] == "tree" and fused == plain and none == []
    assert attempts.count(True) == 304, "every tensor of the state dict is read by the fused step"
    with ckptfs.open(path) as ck:
        assert len(ck.tensors) == 304


def _data_pkl(obj: Any) -> tuple[bytes, dict[str, bytes]]:
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    with zipfile.ZipFile(buffer) as archive:
        names = archive.namelist()
        prefix = names[0].split("/")[0] + "/"
        records = {n[len(prefix):]: archive.read(n) for n in names if "/data/" in n}
        return archive.read(prefix + "data.pkl"), records


SMALL = _data_pkl({"a": torch.zeros(2, 3), "b": torch.arange(6, dtype=torch.int16)[1:5].view(2, 2),
                   "c": torch.ones((), dtype=torch.float64)})


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(edits=st.lists(st.tuples(st.integers(0, len(SMALL[0]) - 1), st.integers(0, 255),
                                st.sampled_from(["set", "insert", "delete"])), min_size=1, max_size=3))
def test_mutated_records_give_what_the_opcodes_give(edits: list[tuple[int, int, str]], tmp_path: Path) -> None:
    """Lying lengths, wrong counts, missing memo keys, other opcodes: fused or not, one outcome."""
    data = bytearray(SMALL[0])
    for position, byte, edit in edits:
        position = min(position, len(data) - 1)
        if edit == "set":
            data[position] = byte
        elif edit == "insert":
            data.insert(position, byte)
        else:
            del data[position]
    path = write_raw_archive(tmp_path / "mutated.pt", bytes(data), SMALL[1])
    assert outcome(path, True)[0] == outcome(path, False)[0]


def test_a_tiny_memo_limit_is_met_by_the_opcodes(tmp_path: Path) -> None:
    """Near a limit the opcodes run, so the limit errors are exactly theirs."""
    path = write_raw_archive(tmp_path / "sd.pt", *_data_pkl({f"t{n}": torch.zeros(2) for n in range(20)}))
    with fusion(True) as attempts, pytest.raises(ckptfs.LimitExceededError, match="pickle memo exceeds 30 entries"):
        ckptfs.open(path, ckptfs.Limits(max_memo_entries=30))
    assert attempts.count(True) < 5


def test_a_record_left_to_the_opcodes_leaves_the_memo_as_it_was(tmp_path: Path) -> None:
    """The class's PUT overwrites memo 5, read just before; the key's length lies, so the opcodes run."""
    body = (b"\x80\x02X\x07\x00\x00\x00storageq\x05" + b"0"
            + b"ctorch._utils\n_rebuild_tensor_v2\nq\x02"
            + b"((h\x05ctorch\nFloatStorage\nq\x05X\x03\x00\x00\x000q\x06X\x03\x00\x00\x00cpuq\x07K\x04tq\x08Q"
            + b"K\x00K\x04\x85q\x09K\x01\x85q\x0a\x89ccollections\nOrderedDict\nq\x0b)Rq\x0ctq\x0dRq\x0e.")
    assert tensor_record.PATTERN.match(body, body.index(b"(("))
    path = write_raw_archive(tmp_path / "lying.pt", body, {"data/0": bytes(16)})
    fused, attempts = outcome(path, True)
    assert attempts == [False]
    assert fused == outcome(path, False)[0] == (
        "error", "CorruptCheckpointError", f"{path}: storage record 'data/0q\\x06' is missing from the archive")
