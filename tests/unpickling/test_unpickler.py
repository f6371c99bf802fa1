"""The safe unpickler against Python's pickle, its refusals, and code-execution payloads."""

from __future__ import annotations

import math
import pickle
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ckptfs.errors import TruncatedPickleError, UnpicklingError
from ckptfs.model import rebuild
from ckptfs.pickle.unpickler import load_at
from ckptfs.pickle.values import Global, PickledObject

PROTOCOLS = range(pickle.HIGHEST_PROTOCOL + 1)
CONTAINERS = (list, dict, set, tuple, frozenset, bytearray)


def safe_loads(data: bytes) -> Any:
    value, end = load_at(data, resolve=rebuild.resolve)
    assert end == len(data)
    return value


def assert_same_value(ours: Any, theirs: Any, pairs: dict[int, int] | None = None) -> None:
    """Equal values of identical types, and the same sharing: one object in pickle's result is one in ours."""
    pairs = {} if pairs is None else pairs
    if isinstance(theirs, CONTAINERS):
        if id(ours) in pairs:
            assert pairs[id(ours)] == id(theirs), "sharing differs"
            return
        pairs[id(ours)] = id(theirs)
        assert len(set(pairs.values())) == len(pairs), "two of our objects are one in pickle's result"
    assert type(ours) is type(theirs), (ours, theirs)
    if isinstance(theirs, float):
        assert (math.isnan(ours) and math.isnan(theirs)) or (
            ours == theirs and math.copysign(1, ours) == math.copysign(1, theirs))
    elif isinstance(theirs, (list, tuple)):
        assert len(ours) == len(theirs)
        for mine, other in zip(ours, theirs):
            assert_same_value(mine, other, pairs)
    elif isinstance(theirs, dict):
        assert list(ours) == list(theirs)
        for key in theirs:
            assert_same_value(ours[key], theirs[key], pairs)
    else:
        assert ours == theirs


_hashables = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8)
    | st.binary(max_size=8),
    lambda children: st.tuples(children, children) | st.frozensets(children, max_size=3),
    max_leaves=4,
)
_values = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(2**2100), max_value=2**2100) | st.integers()
    | st.floats() | st.text() | st.binary() | st.builds(bytearray, st.binary(max_size=8))
    | st.complex_numbers(allow_nan=False),
    lambda children: st.lists(children, max_size=5) | st.lists(children, max_size=4).map(tuple)
    | st.dictionaries(_hashables, children, max_size=4) | st.sets(_hashables, max_size=4)
    | st.frozensets(_hashables, max_size=4),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None)
@given(value=_values, protocol=st.sampled_from(PROTOCOLS))
def test_plain_data_round_trips(value: Any, protocol: int) -> None:
    data = pickle.dumps(value, protocol=protocol)
    assert_same_value(safe_loads(data), pickle.loads(data))


@settings(max_examples=100, deadline=None)
@given(value=_values, protocol=st.sampled_from(PROTOCOLS))
def test_shared_references_stay_one_object(value: Any, protocol: int) -> None:
    inner = [value]
    obj = {"a": inner, "b": [inner, (inner, {"c": inner})]}
    ours = safe_loads(pickle.dumps(obj, protocol=protocol))
    assert ours["a"] is ours["b"][0] is ours["b"][1][0] is ours["b"][1][1]["c"]


def _self_list() -> Any:
    a: list[Any] = []
    a.append(a)
    return a


def _self_dict() -> Any:
    d: dict[str, Any] = {}
    d["me"] = [d, (d,)]
    return d


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("make", [_self_list, _self_dict])
def test_self_references_terminate(make: Callable[[], Any], protocol: int) -> None:
    data = pickle.dumps(make(), protocol=protocol)
    ours = safe_loads(data)
    assert_same_value(ours, pickle.loads(data))
    if isinstance(ours, list):
        assert ours[0] is ours
    else:
        assert ours["me"][0] is ours and ours["me"][1][0] is ours


# -- refusals and malformed streams ----------------------------------------------------


def _out_of_band_buffer() -> bytes:
    return pickle.dumps(pickle.PickleBuffer(bytearray(b"abc")), protocol=5, buffer_callback=lambda _: False)


@pytest.mark.parametrize(("data", "opcode"), [
    (b"\x80\x02\x82\x01.", "EXT1"),
    (b"\x80\x02\x83\x01\x02.", "EXT2"),
    (b"\x80\x02\x84\x01\x02\x03\x04.", "EXT4"),
    (_out_of_band_buffer(), "NEXT_BUFFER"),
    (b"\x80\x05N\x98.", "READONLY_BUFFER"),
])
def test_refused_opcodes(data: bytes, opcode: str) -> None:
    with pytest.raises(UnpicklingError, match=f"opcode {opcode} at offset \\d+ is refused"):
        safe_loads(data)


def test_unknown_opcode_is_named() -> None:
    with pytest.raises(UnpicklingError, match="unknown or refused opcode 0xff at offset 2"):
        safe_loads(b"\x80\x02\xff.")


@settings(max_examples=100, deadline=None)
@given(value=_values, protocol=st.sampled_from(PROTOCOLS), data=st.data())
def test_truncated_streams_raise(value: Any, protocol: int, data: st.DataObject) -> None:
    stream = pickle.dumps(value, protocol=protocol)
    cut = data.draw(st.integers(0, len(stream) - 1), label="cut")
    with pytest.raises(TruncatedPickleError, match="truncated"):
        safe_loads(stream[:cut])


@pytest.mark.parametrize(("data", "message"), [
    (b"\x80\x02X\xff\xff\xff\x7fabc.", "truncated"),
    (b"\x80\x04\x8d" + struct.pack("<Q", 2**63) + b"abc.", "truncated"),
    (b"\x80\x02h\x05.", "memo key 5 not found"),
    (b"\x80\x02a.", "stack underflow"),
    (b"\x80\x02e.", "no MARK"),
    (b"\x80\x02}K\x01s.", "stack underflow"),
    (b"\x80\x02K\x01K\x02a.", "APPEND on a int"),
    (b"\x80\x02K\x01K\x02K\x03s.", "SETITEM on a int"),
    (b"\x80\x06N.", "unsupported pickle protocol 6"),
])
def test_malformed_streams_raise(data: bytes, message: str) -> None:
    with pytest.raises(UnpicklingError, match=message):
        safe_loads(data)


# -- code execution payloads ---------------------------------------------------------------


def _text(value: str) -> bytes:
    raw = value.encode()
    return b"X" + struct.pack("<I", len(raw)) + raw


def _reduce_os_system(canary: Path) -> bytes:
    return b"\x80\x02cos\nsystem\n" + _text(f"touch {canary}") + b"\x85R."


def _reduce_eval(canary: Path) -> bytes:
    return b"\x80\x02c__builtin__\neval\n" + _text(f"open({str(canary)!r}, 'w').close()") + b"\x85R."


def _reduce_subprocess(canary: Path) -> bytes:
    return b"\x80\x02csubprocess\ncall\n((" + _text("touch") + _text(str(canary)) + b"ltR."


def _stack_global_system(canary: Path) -> bytes:
    return b"\x80\x04" + _text("os") + _text("system") + b"\x93" + _text(f"touch {canary}") + b"\x85R."


def _inst_system(canary: Path) -> bytes:
    return b"(" + _text(f"touch {canary}") + b"ios\nsystem\n."


def _obj_system(canary: Path) -> bytes:
    return b"(cos\nsystem\n" + _text(f"touch {canary}") + b"o."


def _newobj_build_setstate(canary: Path) -> bytes:
    # NEWOBJ makes an instance; BUILD (None, {'__setstate__': os.system}) sets the attribute,
    # and the next BUILD calls it with the command.
    return (b"\x80\x02cargparse\nNamespace\n)\x81N}" + _text("__setstate__") + b"cos\nsystem\ns\x86b"
            + _text(f"touch {canary}") + b"b.")


PAYLOADS: dict[str, Callable[[Path], bytes]] = {
    "reduce_os_system": _reduce_os_system,
    "reduce_eval": _reduce_eval,
    "reduce_subprocess": _reduce_subprocess,
    "stack_global_system": _stack_global_system,
    "inst_system": _inst_system,
    "obj_system": _obj_system,
    "newobj_build_setstate": _newobj_build_setstate,
}


@pytest.mark.parametrize("name", PAYLOADS)
def test_payload_really_executes_under_pickle(tmp_path: Path, name: str) -> None:
    """Proves each payload below is live: Python's own pickle runs it (in a child process)."""
    canary = tmp_path / "pickle-ran-it"
    payload = PAYLOADS[name](canary)
    subprocess.run([sys.executable, "-c", "import pickle, sys; pickle.loads(sys.stdin.buffer.read())"],
                   input=payload, check=True, capture_output=True)
    assert canary.exists()


@pytest.mark.parametrize("name", PAYLOADS)
def test_payload_stays_inert(tmp_path: Path, name: str) -> None:
    canary = tmp_path / "ckptfs-ran-it"
    value = safe_loads(PAYLOADS[name](canary))
    assert not canary.exists()
    assert isinstance(value, PickledObject)
    called = value.callable
    assert isinstance(called, Global) and called.module in ("os", "builtins", "subprocess", "argparse")
