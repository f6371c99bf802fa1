"""A big directory's plan (``fs.nodes.listing_plan``), made from each view's flags for all its children at once (a
column at a time when each view is shown beside all its tensors or none), is the plan made a child at a time, for
any tensors (with and without a ``.npy``, per-channel quantized, without data), values and views shown."""

from __future__ import annotations

from array import array
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from corpus import save_zip
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ckptfs
import ckptfs.fs.nodes
from ckptfs.fs.layout import Layout
from ckptfs.fs.nodes import SLOT_BITS, listing_plan
from ckptfs.fs.views import VIEW_NAMES
from ckptfs.model.records import Tensor

pytestmark = [pytest.mark.filterwarnings("ignore:torch.quantize_per"),
              pytest.mark.filterwarnings("ignore:TypedStorage")]


@pytest.fixture(scope="module")
def opened(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ckptfs.Checkpoint, list[Tensor]]]:
    per_channel = torch.quantize_per_channel(torch.ones(3, 2), torch.tensor([0.5, 0.25, 0.125]),
                                             torch.tensor([0, 1, 2]), 0, torch.qint8)
    obj = {"f32": torch.ones(3), "bf16": torch.ones(2, dtype=torch.bfloat16), "q": per_channel,
           "qt": torch.quantize_per_tensor(torch.ones(2), 0.1, 3, torch.quint8), "meta": torch.empty(4, device="meta"),
           "i8": torch.zeros(0, 2, dtype=torch.int8), "q4": torch.quantize_per_tensor(torch.ones(4), 0.1, 0, torch.quint4x2)}
    with ckptfs.open(save_zip(obj, tmp_path_factory.mktemp("plan") / "plan.pt")) as ck:
        found = [ck.root[key] for key in obj]
        assert all(isinstance(tensor, Tensor) for tensor in found)
        views = Layout(ck).views
        assert {tuple(view.shows(tensor) for view in views) for tensor in found} == {
            (True, True, False, False), (True, False, False, False), (True, True, True, True)}
        yield ck, found


def _by_tensor(values: list[Any], views: Any) -> array[int]:
    """The plan a child at a time: each child's code, then each view's shown beside a tensor."""
    plan = array("I")
    for position, value in enumerate(values):
        plan.append(position << SLOT_BITS)
        if isinstance(value, Tensor):
            plan.extend([position << SLOT_BITS | view.slot for view in views if view.shows(value)])
    return plan


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(picks=st.lists(st.integers(0, 8), max_size=40), repeated=st.integers(0, 40),
       shown=st.sets(st.sampled_from(VIEW_NAMES)))
def test_a_plan_made_a_view_at_a_time_is_the_plan_a_child_at_a_time(
        opened: tuple[ckptfs.Checkpoint, list[Tensor]], monkeypatch: pytest.MonkeyPatch, picks: list[int],
        repeated: int, shown: set[str]) -> None:
    """Children picked among tensors of every kind and values (a view then shown beside some tensors only, or
    beside none, or all: the plan made a column at a time when the children are all tensors)."""
    ck, tensors = opened
    pool = [*tensors, 5, {"a": 1}]
    values = [pool[pick] for pick in picks] * (repeated if len(set(picks)) == 1 else 1)
    views = Layout(ck, views=shown).views
    expected = _by_tensor(values, views)
    for bulk in (0, 1 << 30):  # each view's flags for all the children at once; a child at a time
        monkeypatch.setattr(ckptfs.fs.nodes, "BULK_SIZES", bulk)
        made = listing_plan(values, views)
        assert made.typecode == "I" and made == expected
