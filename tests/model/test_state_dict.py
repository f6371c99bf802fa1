"""A pickled module's state-dict names, and the bounds that hold for hostile module trees."""

from __future__ import annotations

from typing import Any

import pytest

from ckptfs.errors import LimitExceededError
from ckptfs.limits import Limits
from ckptfs.model.dtypes import dtype_by_name
from ckptfs.model.records import Tensor
from ckptfs.model.state_dict import state_dict
from ckptfs.pickle.values import Global, PickledObject


def tensor() -> Tensor:
    return Tensor(dtype_by_name("float32"), (2,), (1,), 0, None)


def module(parameters: dict[Any, Any] | None = None, buffers: dict[Any, Any] | None = None,
           modules: dict[Any, Any] | None = None, non_persistent: set[str] | None = None) -> PickledObject:
    state = {"training": True, "_parameters": parameters or {}, "_buffers": buffers or {},
             "_non_persistent_buffers_set": non_persistent or set(), "_modules": modules or {}}
    return PickledObject(Global("torch.nn.modules.module", "Module"), state=state)


def test_names_as_torch_gives_them() -> None:
    w, b, run, tmp, tied = tensor(), tensor(), tensor(), tensor(), tensor()
    inner = module({"weight": w, "bias": None}, {"running": run, "scratch": tmp}, non_persistent={"scratch"})
    root = module({"tied": tied}, {}, {"0": inner, "skip": None, "1": module({"weight": tied})})
    named = state_dict(root)
    assert named is not None
    assert list(named) == ["tied", "0.weight", "0.running", "1.weight"]
    assert named["tied"] is named["1.weight"] and named["tied"] is not tied  # a copy, one per record
    assert named["0.weight"].dtype is w.dtype and named["0.weight"].trail is None


@pytest.mark.parametrize("root", [{"weight": tensor()}, PickledObject(Global("x", "Y"), state={"a": 1}), None])
def test_what_is_no_module_has_no_state_dict(root: Any) -> None:
    assert state_dict(root) is None


def test_a_module_that_holds_itself_stops_at_the_depth_limit() -> None:
    root = module({"w": tensor()})
    root.state["_modules"]["again"] = root
    with pytest.raises(LimitExceededError, match=r"modules nest deeper than 50 \(limit max_tree_depth\)"):
        state_dict(root, Limits(max_tree_depth=50))


def test_a_module_shared_at_every_level_stops_at_the_tensor_limit() -> None:
    """Each level holds the next twice: 2 ** 30 names if nothing stopped it."""
    level = module({"w": tensor()})
    for _ in range(30):
        level = module({}, {}, {"a": level, "b": level})
    with pytest.raises(LimitExceededError, match=r"names more than 1000 tensors \(limit max_tensors\)"):
        state_dict(level, Limits(max_tensors=1000))
    with pytest.raises(LimitExceededError, match=r"more than 5000 entries \(limit max_tree_nodes\)"):
        state_dict(level, Limits(max_tree_nodes=5000))


def test_long_names_stop_at_the_key_limit() -> None:
    named = module({"w": tensor()})
    named.state["_modules"]["x" * 1000] = named
    with pytest.raises(LimitExceededError, match=r"state dict names exceed 10000 bytes \(limit max_key_bytes\)"):
        state_dict(named, Limits(max_key_bytes=10_000))
    empty = module()
    empty.state["_modules"]["x" * 1000] = empty
    with pytest.raises(LimitExceededError, match=r"a module's name exceeds 10000 bytes \(limit max_key_bytes\)"):
        state_dict(empty, Limits(max_key_bytes=10_000))
