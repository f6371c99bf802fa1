"""The mounted tree: entry names, directories with stable inode numbers, links, sidecars and the index.

Pure — nothing here knows FUSE. ``fuse_ops`` serves what a ``Layout`` describes.

What the mount shows
--------------------
* Every container of the checkpoint's object tree (dict, list, tuple, pickled
  object such as a TorchScript module, sparse or nested tensor) is a directory.
* Every tensor is a regular file holding its logical bytes in C order, with a
  sidecar ``NAME.json`` next to it: its metadata as ``ckptfs info --json`` gives it.
* Every other value is a small file: text and a newline for str, int, float,
  bool and None (``3``, ``0.001``, ``True``, ``None``), the raw bytes for
  bytes, JSON (``ckptfs info``'s ``$`` forms) for anything else.
* A pickled object of a class ckptfs does not interpret holds all the pickle
  gave it (``tree.children``): ``__callable__`` when that is another call's
  result, ``__args__``, ``__kwargs__``, items set on it, and its state's
  attributes (a TorchScript module's) or ``__state__``.
* An object met again (the same tensor or container reachable twice, or a
  cycle) is shown once, at its first path in pickle order; every later
  occurrence is a relative symlink to it (a tensor's sidecar too).
* ``model.safetensors`` at the root and in each of the root's directories
  holding a tensor: their tensors in one safetensors file, see ``fs.safetensors``.
* ``/.zarr/``: the tree as a zarr v3 hierarchy, see ``fs.zarr``; not listed in the root.
* ``/.ckptfs/index.json`` lists every tensor (``path``: its keys as the Python
  API gives them; ``file`` and ``sidecar``: paths relative to the mount root)
  and every other entry (directories, values, links). Each tensor and entry
  has an ``id`` (pre-order; the root directory is 0) and its ``parent``'s id;
  entries give their own ``key`` and ``name`` only, a link its ``target``'s
  id, a value its file's ``size`` (and the ``value`` itself up to 256 bytes),
  so the index grows with the number of entries and not with their depth or size.
* A checkpoint whose root object is not a container (``torch.save(tensor)``)
  shows that object as ``/%root``.

Names: see ``fs.names``. Files beside each tensor: see ``fs.views`` (``views`` chooses which are shown).
With ``nest``, a dict's dotted keys are directories: see ``fs.nest``.

Inode numbers are stable across mounts of the same file: each container gets
a block of numbers in walk order, eight per child (the entry, its sidecar, its
``.npy``, a per-channel quantized tensor's ``NAME.q_scales`` and ``NAME.q_zero_points``, three for later
views; a directory's second is its ``model.safetensors``).
"""

from __future__ import annotations

import threading
from typing import Any, Collection, Sequence

from ckptfs.checkpoint import Checkpoint
from ckptfs.fs.contents import Contents
from ckptfs.fs.index import make_index
from ckptfs.fs.lookup import child_position, listed_names, names_of
from ckptfs.fs.names import CONTROL_DIR, INDEX_NAME
from ckptfs.fs.nodes import BULK_SIZES, SLOT_BITS, Dir, Kind, Node, TensorChildren, ViewNode, listing_plan
from ckptfs.fs.pathtext import PathTexts
from ckptfs.fs.places import DictPairs, Places, holds
from ckptfs.fs.safetensors import SAFETENSORS_NAME
from ckptfs.fs.views import VIEW_NAMES, View, view_names
from ckptfs.fs.views import views as make_views
from ckptfs.fs.zarr import ZARR_CHUNK, ZARR_DIR, ZARR_INO, ZarrDir, ZarrLink, mirror_entries
from ckptfs.gc_pause import gc_paused
from ckptfs.model.records import Key, Tensor
from ckptfs.model.tree import is_container

ROOT_INO = 1
CONTROL_DIR_INO = 2
INDEX_INO = 3
SAFETENSORS_INO = 4
"""The root's ``model.safetensors`` (another directory's is the directory's number plus one: a free view slot)."""
FIRST_BLOCK_INO = 16
SLOTS = 1 << SLOT_BITS
"""Inode numbers per child: the entry and its views (``fs.views``: the sidecar, the ``.npy``, a per-channel
quantized tensor's scales and zero points, three kept for later views)."""
TENSOR_CHILDREN_FROM = 1
"""A directory of this many tensors or more and nothing else keeps no node per child (``TensorChildren``): a
``--nest`` tree's ~69,000 directories of a few tensors at 200,000 would keep as many nodes as a flat one's."""
DIR_CACHE_SIZE = 4096
"""Directories ``Layout.lookup`` remembers by path (a path is at most 4 KiB: PATH_MAX)."""

class Layout(Contents):
    """The directory tree of one checkpoint, built lazily, a directory at a time."""

    def __init__(self, checkpoint: Checkpoint, *, views: Collection[str] = VIEW_NAMES, nest: bool = False,
                 zarr_chunk: int = ZARR_CHUNK) -> None:
        """``views``: the views shown (``fs.views.VIEW_NAMES``; the tensors' files and the index always are);
        ``nest``: dicts' dotted keys shown as directories (``fs.nest``); ``zarr_chunk``: ``/.zarr``'s chunk bytes."""
        self.checkpoint, self.zarr_chunk = checkpoint, zarr_chunk
        self.view_names = view_names(views)
        root = checkpoint.root
        self.boxed = not is_container(root)
        """The root object is not a container: it is shown as ``/%root``."""
        top = [root] if self.boxed else root
        with gc_paused():  # the collector's passes over the parse's records, which all live on, cost 2-4x the walk
            self.places = Places(top, FIRST_BLOCK_INO, SLOTS, nest, met_once=checkpoint.alias_count == 0)
        self._dirs: dict[str, Dir] = {}
        self._dirs_by_ino: dict[int, Dir] = {}
        """Directories ``node_at`` found, by inode number (bounded as ``_dirs``): every request names one, and a
        ``--nest`` tree's are deep."""
        self.root = Dir(ROOT_INO, "", None, None, top)
        self.control = Dir(CONTROL_DIR_INO, CONTROL_DIR, self.root, None, None)
        index = Node(INDEX_INO, Kind.INDEX, INDEX_NAME, self.control, None, None)
        self.control.entries = {INDEX_NAME: index}
        self.control.head = [index]
        self.zarr_root = ZarrDir(ZARR_INO + 4 * ROOT_INO, ZARR_DIR, self.root, self.root, False, zarr_chunk)
        self._lock = threading.RLock()
        self._made: tuple[int, Any] | None = None
        """The last index or ``model.safetensors`` made, by its inode number: one at a time, as each is tens of MiB
        for 200,000 tensors (a listing needs only their sizes, kept on their nodes; an open file its pieces)."""
        self._value_sizes: dict[int, tuple[Any, int]] = {}
        self.paths = PathTexts(checkpoint.limits.max_generated_bytes)
        self.views = make_views(self.paths, checkpoint.extents, self.view_names,
                                steady_written=checkpoint.writer is not None)
        self._view_of_slot: list[View | None] = [None] * SLOTS
        for view in self.views:
            self._view_of_slot[view.slot] = view

    # -- navigation ------------------------------------------------------------

    def lookup(self, path: str) -> Node | None:
        """The node at an absolute path inside the mount (``/`` is the root), or None."""
        if path == "/":
            return self.root
        parent, _, name = path.rpartition("/")
        directory = self._directory(parent)
        return None if directory is None else self.entry(directory, name)

    def _directory(self, path: str) -> Dir | None:
        """The directory at ``path`` (``""`` for the root), or None.

        Every FUSE request names its full path: resolving it from the nearest
        cached ancestor keeps a request's cost from growing with its depth.
        """
        unresolved: list[tuple[str, str]] = []
        node = self._dirs.get(path)
        while node is None and path:
            parent, _, name = path.rpartition("/")
            unresolved.append((path, name))
            path = parent
            node = self._dirs.get(path)
        if node is None:
            node = self.root
        for full, name in reversed(unresolved):
            child = self.own_entry(node, name)
            if not isinstance(child, Dir):
                return None
            if len(self._dirs) >= DIR_CACHE_SIZE:
                # Starting over rather than evicting one at a time: cheap, thread-safe, and still bounded.
                self._dirs.clear()
            self._dirs[full] = node = child
        return node

    def entries(self, directory: Dir) -> dict[str, Node]:
        """The directory's own entries by name: views are not among them (``entry`` finds those too)."""
        if directory.entries is None:
            with self._lock, gc_paused():
                if directory.entries is None:
                    self._build(directory)
        assert directory.entries is not None
        return directory.entries

    def entry(self, directory: Dir, name: str) -> Node | None:
        """The entry called ``name`` in the directory, views included, or None."""
        found = self.own_entry(directory, name)
        if found is not None or isinstance(directory, ZarrDir):
            return found
        for view in self.views:
            if name.endswith(view.suffix):
                # No child's name ends with a view's suffix (fs.names): the rest of the name is the tensor's.
                child = self.own_entry(directory, name[: -len(view.suffix)])
                if (child is not None and (child.kind is Kind.TENSOR or child.kind is Kind.LINK)
                        and isinstance(child.value, Tensor) and view.shows(child.value)):
                    return ViewNode.beside(child, view)
        return None

    def own_entry(self, directory: Dir, name: str) -> Node | None:
        """``entries(directory).get(name)``; before the entries are made, only the entry called ``name`` is
        (``fs.lookup``): a path's lookup costs its depth, not its directories' sizes."""
        if directory.entries is not None or isinstance(directory, ZarrDir):
            found = self.entries(directory).get(name)
            if found is None and isinstance(directory.children, TensorChildren):  # its children are not entries
                position = child_position(self.places, directory, name, False)
                return None if position is None else directory.children[position]
            return found
        if directory is self.root and name in (CONTROL_DIR, ZARR_DIR):
            return self.control if name == CONTROL_DIR else self.zarr_root if "zarr" in self.view_names else None
        if name == SAFETENSORS_NAME:
            return self._bundle(directory) if self._has_safetensors(directory) else None
        position = child_position(self.places, directory, name, self.boxed and directory is self.root)
        return None if position is None else self._child_at(directory, position, name)

    def _child_at(self, directory: Dir, position: int, name: str | None = None) -> Node:
        """The node of the directory's child at ``position`` (called ``name``), made alone unless the entries are."""
        with self._lock:
            if directory.entries is not None:
                return directory.children[position]
            made = directory.made = directory.made or {}
            found = made.get(position)
            if found is None:
                key, child = self.places.pairs(directory.value)[position]
                if name is None:
                    name = names_of(self.places, directory, self.boxed and directory is self.root)[0][position]
                ino = self.places.block(directory.value) + SLOTS * position
                found = made[position] = self._node(directory, position, key, child, name, ino)
            return found

    def _bundle(self, directory: Dir) -> Node:
        """The directory's ``model.safetensors`` node (one, whether looked up or listed first)."""
        with self._lock:
            made = directory.made = directory.made or {}
            found = made.get(-1)
            if found is None:
                ino = SAFETENSORS_INO if directory is self.root else directory.ino + 1
                found = made[-1] = Node(ino, Kind.BUNDLE, SAFETENSORS_NAME, directory, None, directory.value)
            return found

    def listing(self, directory: Dir) -> list[Node]:
        """The directory's entries in listing order: each child followed by its views."""
        return self.listing_slice(directory, 0, self.listing_length(directory))

    def listing_length(self, directory: Dir) -> int:
        self.entries(directory)
        return len(directory.head) + len(directory.plan) + len(directory.tail)

    def listing_slice(self, directory: Dir, start: int, stop: int) -> list[Node]:
        """Entries ``start`` to ``stop`` of ``listing``: a big directory's listing is made a window at a time."""
        self.entries(directory)
        return directory.listed(start, stop, self._view_of_slot)

    def listing_columns(self, directory: Dir, start: int, stop: int) -> tuple[list[str], list[int], list[Kind]]:
        """The names, inode numbers and kinds of ``listing_slice``'s entries, without making a node per view."""
        self.entries(directory)
        return directory.listed_columns(start, stop, self._view_of_slot)

    def listing_sizes(self, directory: Dir, start: int, stop: int) -> list[int]:
        """``sizes(listing_slice(directory, start, stop))``, made in bulk without a node per view."""
        if min(stop, self.listing_length(directory)) - start < BULK_SIZES and not isinstance(
                directory.children, TensorChildren):
            return self.sizes(self.listing_slice(directory, start, stop))
        return directory.listed_sizes(start, stop, self._view_of_slot, self.size)

    def children(self, directory: Dir) -> Sequence[Node]:
        """One node per child of the directory's container, by position: no views, no ``.ckptfs``."""
        self.entries(directory)
        return directory.children

    def has_values(self, directory: Dir) -> bool:
        """Whether a child of the directory is a plain value's file (a directory of tensors only makes no node)."""
        children = self.children(directory)
        return not isinstance(children, TensorChildren) and any(child.kind is Kind.VALUE for child in children)

    def _build(self, directory: Dir) -> None:
        if isinstance(directory, ZarrDir):
            found = mirror_entries(directory, [] if directory.array else self.children(directory.mirrors))
            directory.head, directory.entries = found, {node.name: node for node in found}
            return
        container = directory.value
        pairs = self.places.pairs(container)
        base = self.places.block(container)
        entries: dict[str, Node] = {}
        kids: Sequence[Node] = []
        if directory is self.root:
            # /.zarr is found by its path but not listed: find, du and cp -r would walk the tree twice.
            entries[CONTROL_DIR] = self.control
            if "zarr" in self.view_names:
                entries[ZARR_DIR] = self.zarr_root
            directory.head = [self.control]
        boxed = self.boxed and directory is self.root
        names = listed_names(self.places, directory, boxed)
        made = directory.made or {}
        values = [child for _, child in pairs]
        if not made and not boxed and len(values) >= TENSOR_CHILDREN_FROM and set(map(type, values)) == {Tensor}:
            kids = TensorChildren(directory, pairs, pairs.values if isinstance(pairs, DictPairs) else values, names, base,
                                  self.places.firsts_in(container, values))
        else:
            kids = []
            for position, (key, child) in enumerate(pairs):
                name = names[position]
                node = made.get(position) or self._node(directory, position, key, child, name, base + SLOTS * position)
                entries[name] = node
                kids.append(node)
        if self._has_safetensors(directory):
            bundle = entries[SAFETENSORS_NAME] = self._bundle(directory)
            directory.tail = [bundle]
        directory.made = directory.named = None
        directory.plan = listing_plan(values, self.views)
        directory.children = kids
        directory.entries = entries

    def _has_safetensors(self, directory: Dir) -> bool:
        """The root (holding any tensor) and each of its children holding one have a ``model.safetensors``."""
        if "safetensors" not in self.view_names:
            return False
        if directory is self.root:
            return bool(self.checkpoint.tensors)
        return directory.parent is self.root and self.places.holds_tensors(directory.value)

    def safetensors_paths(self) -> list[str]:
        """Where the ``model.safetensors`` files are, relative to the mount root."""
        tops = [self.root, *(child for child in self.children(self.root) if isinstance(child, Dir))]
        return [SAFETENSORS_NAME if top is self.root else f"{self.path_of(top)}/{SAFETENSORS_NAME}"
                for top in tops if self._has_safetensors(top)]

    def _node(self, directory: Dir, position: int, key: Key, child: Any, name: str, ino: int) -> Node:
        if not (isinstance(child, Tensor) or holds(child)):
            return Node(ino, Kind.VALUE, name, directory, key, child)
        if not self.places.is_first_place(child, directory.value, position):
            return Node(ino, Kind.LINK, name, directory, key, child)
        if isinstance(child, Tensor):
            return Node(ino, Kind.TENSOR, name, directory, key, child)
        return Dir(ino, name, directory, key, child)

    def node_at(self, ino: int) -> Node | None:
        """The node of the tree (not below ``/.zarr``) with inode number ``ino``, or None: found from the number
        alone (``SLOTS`` per child in its container's block), kept nowhere but where ``entry`` keeps it (and
        directories, remembered by number)."""
        if ino < FIRST_BLOCK_INO:
            if ino == SAFETENSORS_INO:
                return self._bundle(self.root) if self._has_safetensors(self.root) else None
            return {ROOT_INO: self.root, CONTROL_DIR_INO: self.control, INDEX_INO: self.control.head[0]}.get(ino)
        known = self._dirs_by_ino.get(ino)
        if known is not None:
            return known
        found = self.places.place_of(ino)
        if found is None:
            return None
        container, position, slot = found
        directory = self.node_of(container)
        assert isinstance(directory, Dir), "a container with a block is a directory at its first place"
        child = self._child_at(directory, position)
        if not slot:
            return self._remembered(child)
        if isinstance(child, Dir):  # a directory's second number is its model.safetensors
            return self._bundle(child) if slot == 1 and self._has_safetensors(child) else None
        view = self._view_of_slot[slot]
        if view is None or not isinstance(child.value, Tensor) or child.kind not in (Kind.TENSOR, Kind.LINK):
            return None
        return ViewNode.beside(child, view) if view.shows(child.value) else None

    def node_of(self, value: Any) -> Node:
        """The node showing a tensor or container at its first place."""
        positions: list[int] = []
        node: Node | None = None
        while value is not self.root.value and node is None:  # up to the root, or to a directory remembered
            value, index = self.places.first_place(value)
            node = self._dirs_by_ino.get(self.places.block(value) + SLOTS * index)
            if node is None:
                positions.append(index)
        node = node or self.root
        for index in reversed(positions):
            assert isinstance(node, Dir)
            node = self._remembered(self._child_at(node, index))
        return node

    def _remembered(self, node: Node) -> Node:
        if isinstance(node, Dir):
            if len(self._dirs_by_ino) >= DIR_CACHE_SIZE:
                self._dirs_by_ino.clear()  # as _dirs: cheap, thread-safe, bounded
            self._dirs_by_ino[node.ino] = node
        return node

    def path_of(self, node: Node) -> str:
        """The node's path relative to the mount root (``.`` for the root)."""
        names: list[str] = []
        while node.parent is not None:
            names.append(node.name)
            node = node.parent
        return "/".join(reversed(names)) or "."

    def link_target(self, node: Node) -> str:
        if isinstance(node, ZarrLink):
            return self.link_target(node.mirrors)
        target = self.node_of(node.value)
        here = _ancestry(node.parent)
        there = _ancestry(target)
        common = 0
        while common < min(len(here), len(there)) and here[common] is there[common]:
            common += 1
        parts = [".."] * (len(here) - common) + [n.name for n in there[common:]]
        path = "/".join(parts) or "."
        return path + node.view.suffix if isinstance(node, ViewNode) else path

    def index_bytes(self) -> bytearray:
        """The index (made on first use); a bytearray not to be changed: the text is not copied to a bytes."""
        with self._lock, gc_paused():
            if self._made is None or self._made[0] != INDEX_INO:
                self._made = None  # the last one made is let go first: never two at once
                self._made = (INDEX_INO, make_index(self))
            return self._made[1]  # type: ignore[no-any-return]


def _ancestry(node: Node | None) -> list[Node]:
    """The nodes from the root down to ``node``, both included."""
    chain: list[Node] = []
    while node is not None:
        chain.append(node)
        node = node.parent
    chain.reverse()
    return chain
