"""The registry of sections, in the order they run: one line each. A new section is a module of its own with a
``run(bench)`` (and optionally ``define_checks(bench)``), added here."""

from __future__ import annotations

import big
import dcp_scale
import many
import scale
import scale_cases
import values
import views
import write
import write_fill
from common import BenchError, drop_cache, log, resident, timed, warm
from harness import Bench, Section
from metadata_cache import run_cached
from results import Check


def _cache(bench: Bench) -> None:
    run_cached(bench, log)


def _views(bench: Bench) -> None:
    views.run(bench, views.Tools(timed, drop_cache, resident, warm, log, BenchError))


def _views_checks(bench: Bench) -> None:
    bench.res.side_notes.update(views.SIDE_NOTES)
    views.define_checks(bench, Check)


def _remote(bench: Bench) -> None:
    import remote  # its S3 clients are installed for this section only (scripts/bench --remote)

    bench.res.meta["remote_table"] = remote.run(bench)


def _scale(bench: Bench) -> None:
    scale.run(bench)
    scale_cases.run(bench)
    dcp_scale.run(bench)


def _scale_checks(bench: Bench) -> None:
    scale.define_checks(bench)
    scale_cases.define_checks(bench)
    dcp_scale.define_checks(bench)


def _write_checks(bench: Bench) -> None:
    bench.res.side_notes.update(write.SIDE_NOTES)
    write.define_checks(bench)


def _distributed(bench: Bench) -> None:
    import dask_cluster  # dask and distributed: installed for this section (scripts/bench --sections distributed)

    bench.res.meta["distributed_table"] = dask_cluster.run(bench, log)


def _write_fill(bench: Bench) -> None:
    bench.res.meta["write_fill_table"] = write_fill.run(bench)


SECTIONS = (
    Section(big.NAMES, big.run, big.define_checks),
    Section(("many",), many.run, many.define_checks),
    Section(("cache",), _cache),
    Section(("views",), _views, _views_checks, default=False),
    Section(("remote",), _remote, default=False),
    Section(("scale",), _scale, _scale_checks, default=False, own_checkpoint=True),
    Section(("values",), values.run, values.define_checks, default=False, own_checkpoint=True),
    Section(("distributed",), _distributed, default=False, own_checkpoint=True),
    Section(("write",), write.run, _write_checks, default=False, own_checkpoint=True),
    Section(("write-fill",), _write_fill, default=False, own_checkpoint=True),
)
DEFAULT_NAMES = tuple(name for s in SECTIONS if s.default for name in s.names)
OPTIONAL_NAMES = tuple(name for s in SECTIONS if not s.default for name in s.names)
