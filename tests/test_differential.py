"""ckptfs against torch: every tensor's metadata and bytes, for the corpus and for random checkpoints."""

from __future__ import annotations

import random
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import pytest
import torch
from checks import check_checkpoint
from corpus import (
    ALL_DTYPES,
    BASE_SHAPE,
    CORPUS_NAMES,
    PACKED_DTYPES,
    QUANTIZED_DTYPES,
    VIEW_KINDS,
    CorpusFile,
    dtype_name,
    load_expected,
    random_tensor,
    save_legacy,
    save_zip,
    torch_bytes,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import nn

import ckptfs
from ckptfs.fs.describe import source_ranges

# -- the corpus --------------------------------------------------------------------


@pytest.mark.parametrize("name", CORPUS_NAMES)
def test_corpus_file_matches_torch(corpus: dict[str, CorpusFile], name: str) -> None:
    entry = corpus[name]
    assert entry.expected.tensors
    check_checkpoint(entry.path, entry.expected, random.Random(name))


@pytest.mark.parametrize("name", CORPUS_NAMES)
def test_corpus_file_format(corpus: dict[str, CorpusFile], name: str) -> None:
    with ckptfs.open(corpus[name].path) as ck:
        assert ck.format == corpus[name].format
        assert ck.byteorder == corpus[name].byteorder


@pytest.mark.parametrize("name", ["r2_every_dtype", "r2_every_dtype_legacy"])
def test_quantization_parameters(corpus: dict[str, CorpusFile], name: str) -> None:
    entry = corpus[name]
    schemes = set()
    with ckptfs.open(entry.path) as ck:
        for path, t in entry.expected.tensors.items():
            if not t.is_quantized:
                continue
            q = ck.tensor(path).quantization
            assert q is not None
            schemes.add(q.scheme)
            if t.qscheme() == torch.per_tensor_affine:
                assert (q.scheme, q.scale, q.zero_point) == ("per_tensor_affine", t.q_scale(), t.q_zero_point())
            else:
                assert q.scheme == "per_channel_affine" and q.axis == t.q_per_channel_axis()
                assert q.scales is not None and q.zero_points is not None
                assert ck.read(q.scales) == torch_bytes(t.q_per_channel_scales())
                assert ck.read(q.zero_points) == torch_bytes(t.q_per_channel_zero_points())
    assert schemes == {"per_tensor_affine", "per_channel_affine"}


def test_corpus_covers_every_dtype_and_view(corpus: dict[str, CorpusFile]) -> None:
    """Guards the corpus itself: a recipe that silently lost a dtype would hollow out the tests above."""
    tensors = corpus["r2_every_dtype"].expected.tensors
    for dtype in ALL_DTYPES:
        kinds = {p[1] for p in tensors if p[0] == dtype_name(dtype)}
        assert kinds == ({"contiguous"} if dtype in PACKED_DTYPES else set(VIEW_KINDS)), dtype


# -- random checkpoints ----------------------------------------------------------------


@dataclass(frozen=True)
class TensorSpec:
    dtype: torch.dtype
    view: str
    base: int
    """Which of two base tensors of this dtype the view is taken from (views of one base share storage)."""
    variant: str
    """``plain``, ``conj`` (complex only), ``parameter`` or ``requires_grad`` (floating types only)."""


_GRAD_DTYPES = {torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.complex64, torch.complex128}

_leaves = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(2**80), max_value=2**80), st.floats(),
    st.text(max_size=6), st.binary(max_size=6),
)
_specs = st.builds(TensorSpec, st.sampled_from(ALL_DTYPES), st.sampled_from(tuple(VIEW_KINDS)),
                   st.integers(0, 1), st.sampled_from(("plain", "conj", "parameter", "requires_grad")))
_keys = st.one_of(st.text(max_size=4), st.integers(min_value=-3, max_value=300))
_tensor_or_leaf = st.integers(0, 2).flatmap(lambda i: _specs if i else _leaves)
"""Two thirds tensors: a checkpoint is mostly tensors."""
_trees = st.recursive(
    _tensor_or_leaf,
    lambda children: st.lists(children, max_size=4) | st.lists(children, max_size=3).map(tuple)
    | st.dictionaries(_keys, children, max_size=4),
    max_leaves=12,
)


def materialize(tree: Any, seed: int) -> Any:
    gen = torch.Generator().manual_seed(seed)
    bases: dict[tuple[torch.dtype, int], torch.Tensor] = {}

    def build(spec: TensorSpec) -> torch.Tensor:
        key = (spec.dtype, spec.base)
        if key not in bases:
            bases[key] = random_tensor(spec.dtype, BASE_SHAPE, gen)
        view = bases[key] if spec.dtype in PACKED_DTYPES else VIEW_KINDS[spec.view](bases[key])
        if spec.variant == "conj" and spec.dtype.is_complex:
            return view.conj()
        if spec.variant == "parameter" and spec.dtype not in QUANTIZED_DTYPES + PACKED_DTYPES:
            return nn.Parameter(view, requires_grad=spec.dtype in _GRAD_DTYPES)
        if spec.variant == "requires_grad" and spec.dtype in _GRAD_DTYPES:
            return view.detach().requires_grad_()
        return view

    def walk(node: Any) -> Any:
        if isinstance(node, TensorSpec):
            return build(node)
        if isinstance(node, dict):
            return {k: walk(v) for k, v in node.items()}
        if isinstance(node, (list, tuple)):
            return type(node)(walk(v) for v in node)
        return node

    return walk(tree)


@pytest.fixture(scope="module")
def scratch() -> Iterator[Path]:
    with tempfile.TemporaryDirectory() as directory:
        yield Path(directory)


@settings(max_examples=800, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tree=_trees | st.dictionaries(_keys, _trees, min_size=1, max_size=6), seed=st.integers(0, 2**32 - 1))
def test_random_checkpoints_match_torch(scratch: Path, tree: Any, seed: int) -> None:
    obj = materialize(tree, seed)
    for path in (save_zip(obj, scratch / "random.pt"), save_legacy(obj, scratch / "random_legacy.pt")):
        check_checkpoint(path, load_expected(path, obj), random.Random(seed))


# -- sub-byte quantized views ------------------------------------------------------------------


def test_packed_quantized_views(tmp_path: Path) -> None:
    """torch saves views of quint4x2/quint2x4 but mishandles them itself (``q[1].int_repr()`` reads the
    wrong bytes); ckptfs serves whole-byte-aligned contiguous views and refuses the rest per tensor."""
    floats = torch.randn(4, 6, generator=torch.Generator().manual_seed(3))
    q4 = torch.quantize_per_tensor(floats, 0.1, 2, torch.quint4x2)
    q2 = torch.quantize_per_tensor(floats, 0.1, 2, torch.quint2x4)
    path = save_zip({"q4": q4, "q4_row": q4[1], "q4_t": q4.t(), "q2_row": q2[1], "plain": floats}, tmp_path / "q.pt")
    with ckptfs.open(path) as ck:
        whole = torch_bytes(q4)
        assert ck.read(ck.tensor(("q4",))) == whole
        assert ck.read(ck.tensor(("q4_row",))) == whole[3:6]
        with pytest.raises(ckptfs.UnsupportedError, match="non-contiguous quint4x2"):
            ck.read(ck.tensor(("q4_t",)))
        with pytest.raises(ckptfs.UnsupportedError, match="quint2x4 tensor starts inside a byte"):
            ck.read(ck.tensor(("q2_row",)))
        assert source_ranges(ck.tensor(("q4_t",))) is None and source_ranges(ck.tensor(("q2_row",))) is None
        ((start, end),) = source_ranges(ck.tensor(("q4_row",)))
        assert path.read_bytes()[start:end] == whole[3:6]
        assert ck.read(ck.tensor(("plain",))) == torch_bytes(floats)
