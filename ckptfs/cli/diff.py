"""``ckptfs diff A B``: which tensors two checkpoints share, and how those that differ differ."""

from __future__ import annotations

import argparse
import json
import time
from typing import TYPE_CHECKING, Any, Iterator

from ckptfs.cli.cache_options import add_cache_options
from ckptfs.cli.listing import PADDED_FILE_CHARS, human_size, shape_text
from ckptfs.cli.output import write_text
from ckptfs.cli.printable import printable
from ckptfs.cli.remote_options import add_remote_options
from ckptfs.cli.state_dict_option import add_state_dict_option, opened
from ckptfs.counts import counted
from ckptfs.gc_pause import gc_paused
from ckptfs.model.jsontext import dumps
from ckptfs.model.records import Tensor

if TYPE_CHECKING:
    from ckptfs.cli.compare import Outcome
    from ckptfs.cli.diff_match import Entry

SAME, DIFFERENT, TROUBLE = 0, 1, 2
"""Exit statuses, as diff(1)'s."""
STATUSES = ("equal", "differ", "changed", "only_in_a", "only_in_b", "error")
VALUE_STATUSES = ("equal", "differ", "only_in_a", "only_in_b")
SHOWN_VALUE_CHARS = 60
"""A value longer than this is cut short in the text output (``--json`` gives it whole)."""
STATUS_WORDS = {"equal": "equal", "differ": "differs", "changed": "changed", "only_in_a": "only in A",
                "only_in_b": "only in B", "error": "error"}
DEFAULT_THREADS = 4
"""Chunks read and compared at once: enough to keep a local disk or a remote source busy."""


def add_diff_parser(sub: Any) -> argparse.ArgumentParser:
    diff = sub.add_parser(
        "diff", help="compare two checkpoints tensor by tensor (exit 0 same, 1 different, 2 trouble)",
        description="Compare A and B place by place, matched by exact key path (as `ckptfs ls --json` gives it), "
                    "else by dotted state-dict key (model.embed.weight) when that names one place on each side, "
                    "whatever their formats: one line per tensor that differs (only in A, only in B, dtype or "
                    "shape changed, or its bytes differ: how many elements, the largest absolute difference |b-a| "
                    "and relative one |b-a|/|a|, computed in float64), one per other value that differs (epoch, "
                    "config strings, containers ...), then a summary line. Aliases (places of a tensor met before, "
                    "tied weights) are compared as places too, and said so. Exit status 0 when everything is "
                    "equal, 1 when something differs, 2 on trouble (a file that cannot be read).")
    diff.add_argument("a", metavar="A", help="a checkpoint")
    diff.add_argument("b", metavar="B", help="another checkpoint")
    diff.add_argument("--quick", action="store_true",
                      help="stop reading a tensor at its first difference (its figures then cover what was read)")
    diff.add_argument("-s", "--report-identical", action="store_true", help="list equal tensors too")
    diff.add_argument("--json", action="store_true",
                      help="one JSON object per place (every one, equal ones too), then {\"summary\": {...}}")
    diff.add_argument("--threads", type=_threads, default=DEFAULT_THREADS, metavar="N",
                      help=f"chunks read and compared at once (default {DEFAULT_THREADS})")
    add_state_dict_option(diff)
    add_remote_options(diff)
    add_cache_options(diff)
    diff.set_defaults(run=cmd_diff, error_status=TROUBLE)
    return diff


def _threads(text: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= 256:
        raise argparse.ArgumentTypeError("expected a number of threads from 1 to 256")
    return int(text)


def cmd_diff(args: argparse.Namespace) -> int:
    from ckptfs.cli.compare import Comparison  # here: its thread pool is for diff alone, and every command imports this
    from ckptfs.cli.diff_match import entries, paired

    started = time.monotonic()
    with gc_paused(), opened(args, args.a) as a, opened(args, args.b) as b:
        pairs = paired(entries(a), entries(b))
        comparison = Comparison(a, b, quick=args.quick, threads=args.threads)
        outcomes = comparison.run([(x, y) for x, y in pairs if (x or y).tensor is not None])  # type: ignore[union-attr]
    values = [ValueOutcome(x, y) for x, y in pairs if (x or y).tensor is None]  # type: ignore[union-attr]
    counts = {status: 0 for status in STATUSES}
    for outcome in outcomes:
        counts[outcome.status] += 1
    value_counts = {status: 0 for status in VALUE_STATUSES}
    for value in values:
        value_counts[value.status] += 1
    seconds = time.monotonic() - started
    if args.json:
        write_text(json_lines(outcomes, values, counts, value_counts, comparison.bytes_read, seconds))
    else:
        write_text(text_lines(outcomes, values, args.report_identical))
        write_text([summary_text(counts, value_counts, _aliases(outcomes), comparison.bytes_read, seconds)])
    if counts["error"]:
        return TROUBLE
    same = counts["equal"] == len(outcomes) and value_counts["equal"] == len(values)
    return SAME if same else DIFFERENT


class ValueOutcome:
    """A pair of places that are no tensors: equal when their JSON encodings are (a container's: its kind)."""

    __slots__ = ("place_a", "place_b", "status")

    def __init__(self, place_a: Entry | None, place_b: Entry | None) -> None:
        self.place_a, self.place_b = place_a, place_b
        if place_a is None:
            self.status = "only_in_b"
        elif place_b is None:
            self.status = "only_in_a"
        else:
            self.status = "equal" if dumps(place_a.value) == dumps(place_b.value) else "differ"

    @property
    def place(self) -> Entry:
        place = self.place_a or self.place_b
        assert place is not None
        return place


def _aliases(outcomes: list[Outcome]) -> int:
    return sum(1 for outcome in outcomes if any(p is not None and p.alias_of is not None
                                                for p in (outcome.place_a, outcome.place_b)))


def text_lines(outcomes: list[Outcome], values: list[ValueOutcome], identical: bool) -> Iterator[str]:
    """``STATUS  FILE  WHAT`` lines, the file column aligned: tensors, then the other values."""
    rows: list[tuple[str, str, str]] = []
    for outcome in outcomes:
        if outcome.status != "equal" or identical:
            rows.append((STATUS_WORDS[outcome.status], outcome.place.file, _tensor_text(outcome)))
    for value in values:
        if value.status != "equal" or identical:
            rows.append((STATUS_WORDS[value.status], value.place.file, _value_text(value)))
    files = [printable(file) for _, file, _ in rows]
    status_width = max(map(len, STATUS_WORDS.values()))
    file_width = min(max(map(len, files), default=0), PADDED_FILE_CHARS)
    for (status, _, what), file in zip(rows, files):
        yield f"{status:<{status_width}}  {file:<{file_width}}  {what}".rstrip() + "\n"


def _tensor_text(outcome: Outcome) -> str:
    if outcome.status == "only_in_a":
        text = _described(outcome.a)
    elif outcome.status == "only_in_b":
        text = _described(outcome.b)
    elif outcome.status == "changed":
        text = f"{_described(outcome.a)} -> {_described(outcome.b)}"
    elif outcome.status == "error":
        text = printable(outcome.error or "")
    elif outcome.status == "differ":
        text = _difference(outcome)
    else:
        text = ""
    return (text + "  " + _alias_note(outcome.place_a, outcome.place_b)).strip()


def _alias_note(a: Entry | None, b: Entry | None) -> str:
    """Which side's place is an alias of another tensor's place (tied weights), and of which."""
    left, right = (None if p is None else p.alias_of for p in (a, b))
    if left is not None and left == right:
        return f"(alias of {printable(left)} in A and B)"
    notes = [f"alias of {printable(target)} in {side}" for side, target in (("A", left), ("B", right))
             if target is not None]
    return f"({'; '.join(notes)})" if notes else ""


def _value_text(value: ValueOutcome) -> str:
    shown = [_short(place.value) for place in (value.place_a, value.place_b) if place is not None]
    return " -> ".join(shown) if value.status == "differ" else shown[0] if value.status != "equal" else ""


def _short(value: Any) -> str:
    text = printable(dumps(value))
    return text if len(text) <= SHOWN_VALUE_CHARS else text[:SHOWN_VALUE_CHARS - 3] + "..."


def _described(tensor: Tensor | None) -> str:
    assert tensor is not None
    kind = "" if tensor.has_data else f" ({tensor.kind})"
    return f"{tensor.dtype.name} {shape_text(tensor)}{kind}"


def _difference(outcome: Outcome) -> str:
    assert outcome.a is not None
    bound = "at least " if outcome.partial else ""
    text = f"{bound}{outcome.differing:,} of {counted(outcome.a.numel, 'element')}"
    if outcome.max_abs is not None:
        text += f", max abs {bound}{outcome.max_abs:.6g}, max rel {bound}{outcome.max_rel:.6g}"
    return text + (" (--quick: read up to the first difference)" if outcome.partial else "")


def summary_text(counts: dict[str, int], value_counts: dict[str, int], aliases: int, bytes_read: int,
                 seconds: float) -> str:
    total = sum(counts.values())
    tied = f" ({counted(aliases, 'alias')})" if aliases else ""
    errors = f", {counted(counts['error'], 'error')}" if counts["error"] else ""
    values = sum(value_counts.values())
    return (f"{counted(total, 'tensor path')}{tied}: {counts['equal']:,} equal, {counts['differ']:,} differ, "
            f"{counts['changed']:,} changed dtype or shape, {counts['only_in_a']:,} only in A, "
            f"{counts['only_in_b']:,} only in B{errors}; {counted(values, 'other value')}: "
            f"{value_counts['equal']:,} equal, {value_counts['differ']:,} differ, {value_counts['only_in_a']:,} only "
            f"in A, {value_counts['only_in_b']:,} only in B ({human_size(bytes_read)} read in {seconds:.2f} s)\n")


def _place_fields(outcome: Outcome | ValueOutcome) -> dict[str, Any]:
    place = outcome.place
    record: dict[str, Any] = {"type": "value" if isinstance(outcome, ValueOutcome) else "tensor", "key": place.dotted,
                              "file": place.file, "path": place.path(), "status": outcome.status}
    if outcome.place_a is not None and outcome.place_b is not None and outcome.place_b.file != place.file:
        record["file_b"], record["path_b"] = outcome.place_b.file, outcome.place_b.path()
    return record


def json_lines(outcomes: list[Outcome], values: list[ValueOutcome], counts: dict[str, int],
               value_counts: dict[str, int], bytes_read: int, seconds: float) -> Iterator[str]:
    for outcome in outcomes:
        record = _place_fields(outcome)
        for side, place in (("a", outcome.place_a), ("b", outcome.place_b)):
            if place is not None and place.tensor is not None:
                tensor = place.tensor
                record[side] = {"dtype": tensor.dtype.name, "shape": list(tensor.shape), "kind": tensor.kind,
                                "alias_of": place.alias_of}
        if outcome.status == "differ":
            record.update(differing=outcome.differing, max_abs=_number(outcome.max_abs),
                          max_rel=_number(outcome.max_rel), partial=outcome.partial)
        if outcome.error is not None:
            record["error"] = outcome.error
        yield json.dumps(record, ensure_ascii=False) + "\n"
    for value in values:
        record = _place_fields(value)
        for side, place in (("a", value.place_a), ("b", value.place_b)):
            if place is not None:
                record[side] = {"value": place.value, "alias_of": place.alias_of}
        yield dumps(record) + "\n"
    summary = {"tensors": sum(counts.values()), **counts, "aliases": _aliases(outcomes),
               "values": {"total": sum(value_counts.values()), **value_counts},
               "bytes_read": bytes_read, "seconds": round(seconds, 3)}
    yield json.dumps({"summary": summary}) + "\n"


def _number(value: float | None) -> float | str | None:
    """JSON has no infinity: ``"inf"`` (a relative difference from 0)."""
    if value is None or value == value and abs(value) != float("inf"):
        return value
    return "nan" if value != value else "inf" if value > 0 else "-inf"
