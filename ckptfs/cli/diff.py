"""``ckptfs diff A B``: which tensors two checkpoints share, and how those that differ differ."""

from __future__ import annotations

import argparse
import json
import time
from typing import Any, Iterator

from ckptfs.checkpoint import open_checkpoint
from ckptfs.cli.compare import Comparison, Outcome
from ckptfs.cli.listing import human_size, shape_text
from ckptfs.cli.output import write_text
from ckptfs.cli.printable import printable
from ckptfs.gc_pause import gc_paused
from ckptfs.model.records import Tensor

SAME, DIFFERENT, TROUBLE = 0, 1, 2
"""Exit statuses, as diff(1)'s."""
STATUSES = ("equal", "differ", "changed", "only_in_a", "only_in_b", "error")
DEFAULT_THREADS = 4
"""Chunks read and compared at once: enough to keep a local disk or a remote source busy."""


def add_diff_parser(sub: Any) -> argparse.ArgumentParser:
    diff = sub.add_parser(
        "diff", help="compare two checkpoints tensor by tensor (exit 0 same, 1 different, 2 trouble)",
        description="Compare the tensors of A and B, matched by dotted state-dict key (model.embed.weight), "
                    "whatever their formats: one line per tensor that differs (only in A, only in B, dtype or "
                    "shape changed, or its bytes differ: how many elements, the largest absolute difference |b-a| "
                    "and relative one |b-a|/|a|, computed in float64), then a summary line. Exit status 0 when "
                    "every tensor is equal, 1 when some differ, 2 on trouble (a file that cannot be read).")
    diff.add_argument("a", metavar="A", help="a checkpoint")
    diff.add_argument("b", metavar="B", help="another checkpoint")
    diff.add_argument("--quick", action="store_true",
                      help="stop reading a tensor at its first difference (its figures then cover what was read)")
    diff.add_argument("-s", "--report-identical", action="store_true", help="list equal tensors too")
    diff.add_argument("--json", action="store_true",
                      help="one JSON object per tensor (every one, equal ones too), then {\"summary\": {...}}")
    diff.add_argument("--threads", type=_threads, default=DEFAULT_THREADS, metavar="N",
                      help=f"chunks read and compared at once (default {DEFAULT_THREADS})")
    diff.set_defaults(run=cmd_diff, error_status=TROUBLE)
    return diff


def _threads(text: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= 256:
        raise argparse.ArgumentTypeError("expected a number of threads from 1 to 256")
    return int(text)


def cmd_diff(args: argparse.Namespace) -> int:
    started = time.monotonic()
    with gc_paused(), open_checkpoint(args.a, args.limits) as a, open_checkpoint(args.b, args.limits) as b:
        comparison = Comparison(a, b, quick=args.quick, threads=args.threads)
        outcomes = comparison.run()
    counts = {status: 0 for status in STATUSES}
    for outcome in outcomes:
        counts[outcome.status] += 1
    seconds = time.monotonic() - started
    if args.json:
        write_text(json_lines(outcomes, counts, comparison.bytes_read, seconds))
    else:
        write_text(text_lines(outcomes, args.report_identical, args.a, args.b))
        write_text([summary_text(counts, comparison.bytes_read, seconds)])
    if counts["error"]:
        return TROUBLE
    return SAME if counts["equal"] == len(outcomes) else DIFFERENT


def text_lines(outcomes: list[Outcome], identical: bool, a: str, b: str) -> Iterator[str]:
    for outcome in outcomes:
        key = printable(outcome.key or "(root)")
        if outcome.status == "equal":
            if identical:
                yield f"equal      {key}\n"
        elif outcome.status == "only_in_a":
            yield f"only in A  {key}  {_described(outcome.a)}\n"
        elif outcome.status == "only_in_b":
            yield f"only in B  {key}  {_described(outcome.b)}\n"
        elif outcome.status == "changed":
            yield f"changed    {key}  {_described(outcome.a)} -> {_described(outcome.b)}\n"
        elif outcome.status == "error":
            yield f"error      {key}  {printable(outcome.error or '')}\n"
        else:
            yield f"differs    {key}  {_difference(outcome)}\n"


def _described(tensor: Tensor | None) -> str:
    assert tensor is not None
    kind = "" if tensor.has_data else f" ({tensor.kind})"
    return f"{tensor.dtype.name} {shape_text(tensor)}{kind}"


def _difference(outcome: Outcome) -> str:
    assert outcome.a is not None
    bound = "at least " if outcome.partial else ""
    text = f"{bound}{outcome.differing} of {outcome.a.numel} elements"
    if outcome.max_abs is not None:
        text += f", max abs {bound}{outcome.max_abs:.6g}, max rel {bound}{outcome.max_rel:.6g}"
    return text + (" (--quick: read up to the first difference)" if outcome.partial else "")


def summary_text(counts: dict[str, int], bytes_read: int, seconds: float) -> str:
    total = sum(counts.values())
    errors = f", {counts['error']} errors" if counts["error"] else ""
    return (f"{total} tensors: {counts['equal']} equal, {counts['differ']} differ, {counts['changed']} changed "
            f"dtype or shape, {counts['only_in_a']} only in A, {counts['only_in_b']} only in B{errors} "
            f"({human_size(bytes_read)} read in {seconds:.2f} s)\n")


def json_lines(outcomes: list[Outcome], counts: dict[str, int], bytes_read: int, seconds: float) -> Iterator[str]:
    for outcome in outcomes:
        record: dict[str, Any] = {"key": outcome.key, "status": outcome.status}
        for side, tensor in (("a", outcome.a), ("b", outcome.b)):
            if tensor is not None:
                record[side] = {"dtype": tensor.dtype.name, "shape": list(tensor.shape), "kind": tensor.kind}
        if outcome.status == "differ":
            record.update(differing=outcome.differing, max_abs=_number(outcome.max_abs),
                          max_rel=_number(outcome.max_rel), partial=outcome.partial)
        if outcome.error is not None:
            record["error"] = outcome.error
        yield json.dumps(record, ensure_ascii=False) + "\n"
    summary = {"tensors": sum(counts.values()), **counts, "bytes_read": bytes_read, "seconds": round(seconds, 3)}
    yield json.dumps({"summary": summary}) + "\n"


def _number(value: float | None) -> float | str | None:
    """JSON has no infinity: ``"inf"`` (a relative difference from 0)."""
    if value is None or value == value and abs(value) != float("inf"):
        return value
    return "nan" if value != value else "inf" if value > 0 else "-inf"
