"""Where ``ckptfs.open`` of a torch.save zip spends its time, and what the C unpickler would save (issue 16).

``.venv/bin/python scripts/bench_lib/parse_breakdown.py [--workdir DIR] [--cases zip200k,zip20k] [--runs 3]``

Uses the checkpoints of ``parse_cost.py`` (same ``--workdir``, written with torch if missing). Each figure is
the median CPU time of ``--runs`` runs in this one process, the cyclic GC paused as ``ckptfs mount`` does:

- ``open``: the whole ``ckptfs.open`` on the active path (the header line names it: the compiled scanner when
  built, else the pure-Python fast paths); within it ``pickle``, ``data.pkl`` made into the tree (with the
  compiled scanner: ``compiled scan``, the C scan and its rows copied out, and ``rows to objects``, the
  storages, tensors and dict made from them), and ``rest``, the difference, of which ``zip directory``
  (central directory parse), ``records read``, ``data offsets`` and ``collect`` (the tensors' key paths);
- ``open, pure Python``: the same with the compiled scanner switched off (the pure-Python fast paths);
- ``machine``: the pure-Python interpretation with inert callbacks (every call a ``PickledObject``, persistent ids
  kept): the interpreter's share; ``storages`` and ``handlers``: ckptfs' persistent loads (storage records)
  and handler calls (tensor records) of one open, replayed alone on their recorded inputs. In place they
  cost more (``pickle - machine``): their records are kept, not freed at once;
- ``C floor``: the standard library's C unpickler on the same bytes, placeholders for every call
  (``pickle_floor.py``);
- ``C+callbacks``: ``open C`` minus ``rest``; ``open C``: the whole ``ckptfs.open`` with a PROTOTYPE in place
  of the Python parse: the C unpickler whose ``find_class`` gives a class per global (NEWOBJ needs a type)
  whose ``__new__`` hands the call, its stand-ins turned back into ``Global``s, to ckptfs' own handlers,
  and whose ``persistent_load`` hands the persistent id to ckptfs' storage table; its ``info --json`` text
  is checked to equal the Python path's. It has no limits at all: a measurement, never a parser;
- ``scan (Python)``: a pure-Python pre-scan of the opcodes (boundaries, argument lengths, memo indices,
  stack and MARK depth; no tuple hashing bound), the least a bounded pre-scan in Python does; ``scan (C)``:
  the same in C (``prescan.c``, built with gcc into ``--workdir``; nan without gcc); ``open C+scan`` and
  ``open C+C scan`` add them to ``open C``.

The last line gives the speed-up of ``open`` over the pure-Python open, and that of the C prototypes.
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import io
import os
import pickle
import statistics
import struct
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path
from typing import Any, Callable

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent.parent))
sys.path.insert(0, str(HERE))

import parse_cost  # noqa: E402
import pickle_floor  # noqa: E402

import ckptfs  # noqa: E402
from ckptfs.checkpoint import Checkpoint  # noqa: E402
from ckptfs.cli.info import description_text  # noqa: E402
from ckptfs.formats import zip_checkpoint, zip_columns  # noqa: E402
from ckptfs.formats.zip_archive import ZipArchive  # noqa: E402
from ckptfs.limits import Limits  # noqa: E402
from ckptfs.model import rebuild  # noqa: E402
from ckptfs.pickle import cscan  # noqa: E402
from ckptfs.pickle.machine import _RENAMED_MODULES, no_handler  # noqa: E402
from ckptfs.pickle.unpickler import SafeUnpickler  # noqa: E402
from ckptfs.pickle.values import Global, PickledObject  # noqa: E402


class _StandInType(type):
    """The type of every stand-in class: ``__global__`` is the name it stands for."""

    __global__: Global


def _plain(value: Any) -> Any:
    """``value`` with stand-ins turned back into ``Global``s (inside tuples too)."""
    kind = type(value)
    if kind is _StandInType:
        return value.__global__
    if kind is tuple:
        return tuple(_plain(v) for v in value)
    return value


class _BuildableDict(dict):  # type: ignore[type-arg]
    """A handler's dict that a later BUILD (an OrderedDict's ``_metadata``) may target: the state is dropped."""

    def __setstate__(self, state: Any) -> None:
        pass


def _stand_in(name: Global, resolve: Callable[[Global], Any]) -> _StandInType:
    handler = resolve(name)

    def __new__(cls: type, *args: Any) -> Any:
        plain = tuple(_plain(a) for a in args)
        made = handler(plain) if handler is not None else PickledObject(name, plain)
        return _BuildableDict(made) if type(made) is dict else made

    return _StandInType(name.name, (), {"__new__": __new__, "__global__": name})


def c_load(data: bytes, resolve: Callable[[Global], Any], persistent_load: Callable[[Any], Any]) -> Any:
    stand_ins: dict[tuple[str, str], _StandInType] = {}

    class _Unpickler(pickle.Unpickler):
        def find_class(self, module: str, name: str) -> Any:
            key = (module, name)
            made = stand_ins.get(key)
            if made is None:
                made = stand_ins[key] = _stand_in(Global(_RENAMED_MODULES.get(module, module), name), resolve)
            return made

        def persistent_load(self, pid: Any) -> Any:
            return persistent_load(_plain(pid))

    root = _Unpickler(io.BytesIO(data)).load()
    return dict(root) if type(root) is _BuildableDict else root


def _c_zip_load(pickle_bytes: bytes, table: Any, limits: Any) -> Any:
    return c_load(pickle_bytes, rebuild.resolve, table.persistent_load)


_ARG_BYTES = {op: n for ops, n in [
    (b"(012)t]}Nldsu\x88\x89aeb\x81\x85\x86\x87\x8f\x90\x91\x92\x93\x94RQo", 0), (b"KhqU\x8cC\x80", 1),
    (b"M", 2), (b"JjrG", 4)] for op in ops}
_COUNTED = {op: (n, width) for ops, n, width in [(b"TXB", 4, 4), (b"\x8d\x8e\x96", 8, 8)] for op in ops}
_LINES = frozenset(b"ILFSVgpPci")
_EFFECT = {op: effect for ops, effect in [
    (b"KMJGIFLSTUVXBC\x8a\x8b\x8c\x8d\x8e\x96)]}N\x88\x89\x8fhjgc2P", 1),
    (b"qrp\x94Q\x85\x95\x80", 0), (b"0Rb\x81\x93\x86a", -1), (b"\x92\x87s", -2)] for op in ops}
_PUSH_AFTER_MARK = {op: n for ops, n in [(b"tldio\x91", 1), (b"ue\x901", 0)] for op in ops}
_U32 = struct.Struct("<I")


def scan(data: bytes, max_memo: int, max_depth: int) -> int:
    """Opcodes up to STOP, each argument checked to be present, memo indices below ``max_memo``, stack and
    MARK depth below ``max_depth``; ValueError for anything else. The opcodes' count."""
    pos, end, depth, count = 0, len(data), 0, 0
    marks: list[int] = []
    arg_bytes, counted, lines, effects, after_mark = _ARG_BYTES, _COUNTED, _LINES, _EFFECT, _PUSH_AFTER_MARK
    while pos < end:
        op = data[pos]
        count += 1
        pos += 1
        n = arg_bytes.get(op)
        if n is not None:
            if op == 0x72 or op == 0x6A:
                if _U32.unpack_from(data, pos)[0] >= max_memo:
                    raise ValueError("memo index")
            pos += n
        elif op in counted:
            width = counted[op][1]
            pos += width + int.from_bytes(data[pos:pos + width], "little")
        elif op in lines:
            newline = data.find(b"\n", pos)
            if newline < 0:
                raise ValueError("line")
            pos = newline + 1
            if op == 0x63 or op == 0x69:
                newline = data.find(b"\n", pos)
                if newline < 0:
                    raise ValueError("line")
                pos = newline + 1
        elif op == 0x2E:
            return count
        elif op == 0x95:
            pos += 8
        elif op == 0x8A:
            pos += 1 + data[pos]
        elif op == 0x8B:
            pos += 4 + _U32.unpack_from(data, pos)[0]
        else:
            raise ValueError(f"opcode {op:#x}")
        if pos > end:
            raise ValueError("truncated")
        effect = effects.get(op)
        if effect is not None:
            depth += effect
            if depth < 0 or depth >= max_depth:
                raise ValueError("stack depth")
        elif op == 0x28:
            marks.append(depth)
            if len(marks) >= max_depth:
                raise ValueError("marks")
        else:
            if not marks:
                raise ValueError("no MARK")
            depth = marks.pop() + after_mark[op]
    raise ValueError("no STOP")


def c_scanner(build_dir: Path) -> Callable[[bytes, int, int], int] | None:
    """``prescan.c`` built with gcc and loaded with ctypes: ``scan`` in C (None without gcc)."""
    library = build_dir / "prescan.so"
    try:
        subprocess.run(["gcc", "-O2", "-shared", "-fPIC", "-o", str(library), str(HERE / "prescan.c")], check=True)
    except (OSError, subprocess.CalledProcessError):
        return None
    function = ctypes.CDLL(str(library)).prescan
    function.restype = ctypes.c_longlong
    function.argtypes = [ctypes.c_char_p, ctypes.c_size_t, ctypes.c_uint64, ctypes.c_int64,
                         ctypes.POINTER(ctypes.c_int64)]

    def scan_in_c(data: bytes, max_memo: int, max_depth: int) -> int:
        marks = (ctypes.c_int64 * (data.count(b"(") + 1))()
        count = function(data, len(data), max_memo, max_depth, marks)
        if count < 0:
            raise ValueError("refused")
        return count

    return scan_in_c


def data_pkl(path: Path) -> bytes:
    with zipfile.ZipFile(path) as archive:
        name = next(n for n in archive.namelist() if n.endswith("/data.pkl"))
        return archive.read(name)


def cpu(fn: Callable[[], Any], runs: int) -> float:
    times = []
    for _ in range(runs):
        gc.collect()
        gc.disable()
        start = time.process_time()
        fn()
        times.append(time.process_time() - start)
        gc.enable()
    return statistics.median(times)


def open_and_count(path: Path) -> int:
    with ckptfs.open(str(path)) as ck:
        return len(ck)


def described(path: Path) -> str:
    with ckptfs.open(str(path), limits=Limits(max_generated_bytes=1 << 40)) as ck:
        return description_text(ck)


class _Timers:
    """CPU seconds spent in a few functions called once or twice per open, patched in by name."""

    def __init__(self) -> None:
        self.spent: dict[str, list[float]] = {}
        self.saved: list[tuple[Any, str, Any]] = []

    def patch(self, owner: Any, attr: str, label: str) -> None:
        original = getattr(owner, attr)
        bucket = self.spent.setdefault(label, [])

        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.process_time()
            try:
                return original(*args, **kwargs)
            finally:
                bucket.append(time.process_time() - start)

        self.saved.append((owner, attr, original))
        setattr(owner, attr, timed)

    def per_open(self, label: str, opens: int) -> float:
        return sum(self.spent[label]) / opens

    def restore(self) -> None:
        while self.saved:
            owner, attr, original = self.saved.pop()
            setattr(owner, attr, original)


def callback_costs(path: Path, runs: int) -> tuple[float, float]:
    """CPU seconds of the persistent loads and of the handler calls of one open, replayed on recorded inputs."""
    pids: list[Any] = []
    calls: list[tuple[Any, tuple[Any, ...]]] = []
    tables: list[Any] = []
    python_load = zip_checkpoint._load

    def recording_load(pickle_bytes: bytes, table: Any, limits: Any) -> Any:
        tables.append(table)

        def persistent_load(pid: Any) -> Any:
            pids.append(pid)
            return table.persistent_load(pid)

        def resolve(name: Global) -> Any:
            handler = rebuild.resolve(name)
            if handler is None:
                return None

            def recorded(args: tuple[Any, ...]) -> Any:
                calls.append((handler, args))
                return handler(args)

            return recorded

        return SafeUnpickler(pickle_bytes, resolve=resolve, persistent_load=persistent_load, limits=limits).load()

    zip_checkpoint._load = recording_load
    try:
        open_and_count(path)
    finally:
        zip_checkpoint._load = python_load
    table = tables[0]

    def load_storages() -> None:
        table.storages = {}
        for pid in pids:
            table.persistent_load(pid)

    def call_handlers() -> None:
        for handler, args in calls:
            handler(args)

    return cpu(load_storages, runs), cpu(call_handlers, runs)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workdir", default=os.path.join(tempfile.gettempdir(), "ckptfs-parse-cost"))
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--cases", default="zip200k,zip20k")
    a = p.parse_args()
    workdir = Path(a.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    paths = parse_cost.ensure(workdir)
    scan_in_c = c_scanner(workdir)
    for case in a.cases.split(","):
        path, n = paths[case], parse_cost.CASES[case]
        data = data_pkl(path)
        timers = _Timers()
        timers.patch(zip_checkpoint, "_load", "pickle")
        timers.patch(ZipArchive, "read_records", "records read")
        timers.patch(ZipArchive, "resolve_data_offsets", "data offsets")
        timers.patch(ZipArchive, "_read_directory", "zip directory")
        timers.patch(Checkpoint, "_collect_tensors", "collect")
        timers.patch(cscan, "scan", "compiled scan")
        timers.patch(zip_columns, "_tree", "rows to objects")
        t_open = cpu(lambda: open_and_count(path), a.runs)
        timers.restore()
        t_pickle = timers.per_open("pickle", a.runs)
        saved, cscan.ENABLED = cscan.ENABLED, False
        try:
            t_open_python = cpu(lambda: open_and_count(path), a.runs)
        finally:
            cscan.ENABLED = saved
        t_storages, t_handlers = callback_costs(path, a.runs)
        python_load = zip_checkpoint._load
        zip_checkpoint._load = _c_zip_load
        try:
            t_open_c = cpu(lambda: open_and_count(path), a.runs)
            same_c = described(path)
        finally:
            zip_checkpoint._load = python_load
        same = described(path) == same_c
        t_machine = cpu(lambda: SafeUnpickler(data, resolve=no_handler, persistent_load=lambda pid: pid).load(),
                        a.runs)
        t_floor = cpu(lambda: pickle_floor._FloorUnpickler(io.BytesIO(data)).load(), a.runs)
        opcodes = scan(data, 10_000_000, 10_000_000)
        t_scan = cpu(lambda: scan(data, 10_000_000, 10_000_000), a.runs)
        if scan_in_c is not None:
            assert scan_in_c(data, 10_000_000, 10_000_000) == opcodes
        t_scan_c = cpu(lambda: scan_in_c(data, 10_000_000, 10_000_000), a.runs) if scan_in_c else float("nan")
        t_rest = t_open - t_pickle
        rows = [("open", t_open), ("  pickle", t_pickle)]
        if cscan.LIBRARY is not None and cscan.ENABLED:
            rows += [(f"    {label}", timers.per_open(label, a.runs)) for label in ("compiled scan", "rows to objects")]
        rows += [("  rest", t_rest)]
        rows += [(f"    {label}", timers.per_open(label, a.runs))
                 for label in ("zip directory", "records read", "data offsets", "collect")]
        rows += [("open, pure Python", t_open_python), ("    machine", t_machine), ("    storages", t_storages),
                 ("    handlers", t_handlers)]
        rows += [("C floor", t_floor), ("C+callbacks", t_open_c - t_rest),
                 ("scan (Python)", t_scan), ("scan (C)", t_scan_c),
                 ("open C", t_open_c), ("open C+scan", t_open_c + t_scan),
                 ("open C+C scan", t_open_c + t_scan_c)]
        print(f"{case}: {n} tensors, data.pkl {len(data)} bytes, {opcodes} opcodes ({opcodes / n:.1f} per tensor); "
              f"C prototype's info --json text {'equal' if same else 'DIFFERENT'}; open: {cscan.active_path()}")
        for label, seconds in rows:
            print(f"  {label:18} {seconds:7.3f} s {seconds / n * 1e6:7.2f} µs/tensor")
        print(f"  speed-up of open over pure Python: {t_open_python / t_open:.2f}x; of pure Python's open: C "
              f"{t_open_python / t_open_c:.2f}x, C+scan {t_open_python / (t_open_c + t_scan):.2f}x, "
              f"C+C scan {t_open_python / (t_open_c + t_scan_c):.2f}x", flush=True)


if __name__ == "__main__":
    main()
