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
from typing import Any, Collection

from ckptfs.checkpoint import Checkpoint
from ckptfs.fs.files import value_bytes
from ckptfs.fs.index import make_index
from ckptfs.fs.names import CONTROL_DIR, INDEX_NAME, ROOT_VALUE_NAME, child_names
from ckptfs.fs.nodes import BULK_SIZES, SLOT_BITS, Dir, Kind, Node, ViewNode, listing_plan
from ckptfs.fs.pathtext import PathTexts
from ckptfs.fs.places import Places, holds
from ckptfs.fs.pieces import Literal, Piece, tensor_pieces
from ckptfs.fs.safetensors import SAFETENSORS_NAME, SafetensorsFile, members
from ckptfs.fs.safetensors import Tree as MemberTree
from ckptfs.fs.views import VIEW_NAMES, View, view_names
from ckptfs.fs.views import views as make_views
from ckptfs.fs.zarr import ZARR_CHUNK, ZARR_DIR, ZARR_INO, ZarrDir, ZarrLink, chunk_pieces, chunk_size, mirror_entries
from ckptfs.fs.zarr import document as zarr_document
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
CACHED_VALUE_SIZES = 4096
"""Values whose file sizes ``Layout`` remembers by identity."""
DIR_CACHE_SIZE = 4096
"""Directories ``Layout.lookup`` remembers by path (a path is at most 4 KiB: PATH_MAX)."""

class Layout:
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
        self.places = Places(top, FIRST_BLOCK_INO, SLOTS, nest)
        self._dirs: dict[str, Dir] = {}
        self.root = Dir(ROOT_INO, "", None, None, top)
        self.control = Dir(CONTROL_DIR_INO, CONTROL_DIR, self.root, None, None)
        index = Node(INDEX_INO, Kind.INDEX, INDEX_NAME, self.control, None, None)
        self.control.entries = {INDEX_NAME: index}
        self.control.head = [index]
        self._lock = threading.RLock()
        self._made: tuple[int, Any] | None = None
        """The last index or ``model.safetensors`` made, by its inode number: one at a time, as each is tens of MiB
        for 200,000 tensors (a listing needs only their sizes, kept on their nodes; an open file its pieces)."""
        self._value_sizes: dict[int, tuple[Any, int]] = {}
        self.paths = PathTexts(checkpoint.limits.max_generated_bytes)
        self.views = make_views(self.paths, checkpoint.extents, self.view_names)
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
            child = self.entries(node).get(name)
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
        found = self.entries(directory).get(name)
        if found is not None or isinstance(directory, ZarrDir):
            return found
        for view in self.views:
            if name.endswith(view.suffix):
                # No child's name ends with a view's suffix (fs.names): the rest of the name is the tensor's.
                child = directory.entries.get(name[: -len(view.suffix)])  # type: ignore[union-attr]
                if (child is not None and (child.kind is Kind.TENSOR or child.kind is Kind.LINK)
                        and isinstance(child.value, Tensor) and view.shows(child.value)):
                    return ViewNode.beside(child, view)
        return None

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
        self.entries(directory)
        if stop - start < BULK_SIZES:
            return self.sizes(self.listing_slice(directory, start, stop))
        return directory.listed_sizes(start, stop, self._view_of_slot, self.size)

    def children(self, directory: Dir) -> list[Node]:
        """One node per child of the directory's container, by position: no views, no ``.ckptfs``."""
        self.entries(directory)
        return directory.children

    def _build(self, directory: Dir) -> None:
        if isinstance(directory, ZarrDir):
            found = mirror_entries(directory, [] if directory.array else self.children(directory.mirrors))
            directory.head, directory.entries = found, {node.name: node for node in found}
            return
        container = directory.value
        pairs = self.places.pairs(container)
        base = self.places.block(container)
        entries: dict[str, Node] = {}
        kids: list[Node] = []
        if directory is self.root:
            # /.zarr is found by its path but not listed: find, du and cp -r would walk the tree twice.
            entries[CONTROL_DIR] = self.control
            if "zarr" in self.view_names:
                entries[ZARR_DIR] = ZarrDir(ZARR_INO + 4 * ROOT_INO, ZARR_DIR, self.root, self.root, False,
                                            self.zarr_chunk)
            directory.head = [self.control]
        names = [ROOT_VALUE_NAME] if self.boxed else child_names([key for key, _ in pairs])
        for position, (key, child) in enumerate(pairs):
            name = names[position]
            node = self._node(directory, position, key, child, name, base + SLOTS * position)
            entries[name] = node
            kids.append(node)
        if self._has_safetensors(directory):
            ino = SAFETENSORS_INO if directory is self.root else directory.ino + 1
            bundle = Node(ino, Kind.BUNDLE, SAFETENSORS_NAME, directory, None, container)
            entries[SAFETENSORS_NAME] = bundle
            directory.tail = [bundle]
        directory.plan = listing_plan([child for _, child in pairs], self.views)
        directory.children = kids
        directory.entries = entries

    def _has_safetensors(self, directory: Dir) -> bool:
        """The root (holding any tensor) and each of its children holding one have a ``model.safetensors``."""
        if "safetensors" not in self.view_names:
            return False
        if directory is self.root:
            return bool(self.checkpoint.tensors)
        return directory.parent is self.root and self.places.holds_tensors(directory.value)

    def safetensors(self, node: Node) -> SafetensorsFile:
        """The ``model.safetensors`` a ``BUNDLE`` node shows, made on first use."""
        with self._lock, gc_paused():
            if self._made is not None and self._made[0] == node.ino:
                return self._made[1]  # type: ignore[no-any-return]
            self._made = None
            found, left_out = members(node.value, MemberTree(self.places.pairs, self.places.is_first_place))
            ck = self.checkpoint
            made = SafetensorsFile(found, left_out, ck.path, ck.limits.max_generated_bytes)
            self._made = (node.ino, made)
            return made

    def safetensors_paths(self) -> list[str]:
        """Where the ``model.safetensors`` files are, relative to the mount root."""
        tops = [self.root, *(child for child in self.children(self.root) if isinstance(child, Dir))]
        return [SAFETENSORS_NAME if top is self.root else f"{self.path_of(top)}/{SAFETENSORS_NAME}"
                for top in tops if self._has_safetensors(top)]

    def _node(self, directory: Dir, position: int, key: Key, child: Any, name: str, ino: int) -> Node:
        if not (isinstance(child, Tensor) or holds(child)):
            return Node(ino, Kind.VALUE, name, directory, key, child)
        parent, index = self.places.first_place(child)
        if parent is not directory.value or index != position:
            return Node(ino, Kind.LINK, name, directory, key, child)
        if isinstance(child, Tensor):
            return Node(ino, Kind.TENSOR, name, directory, key, child)
        return Dir(ino, name, directory, key, child)

    def node_of(self, value: Any) -> Node:
        """The node showing a tensor or container at its first place."""
        positions: list[int] = []
        while value is not self.root.value:
            value, index = self.places.first_place(value)
            positions.append(index)
        node: Node = self.root
        for index in reversed(positions):
            assert isinstance(node, Dir)
            node = self.children(node)[index]
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

    # -- contents ----------------------------------------------------------------

    def size(self, node: Node) -> int:
        if node.size < 0:
            node.size = self._size(node)
        return node.size

    def sizes(self, nodes: list[Node]) -> list[int]:
        """``[self.size(node) for node in nodes]``, each view's made together: listings need every one."""
        for view in self.views:
            shown = [node for node in nodes if node.size < 0 and node.kind is Kind.VIEW and node.view is view]
            for node, size in zip(shown, view.sizes([node.value for node in shown])):
                node.size = size
        return [node.size if node.size >= 0 else self.size(node) for node in nodes]

    def _size(self, node: Node) -> int:
        kind = node.kind
        if kind is Kind.TENSOR:
            tensor: Tensor = node.value
            return tensor.nbytes if tensor.has_data else 0
        if kind is Kind.DIR:
            return 0
        if kind is Kind.LINK or kind is Kind.VIEW_LINK:
            return len(self.link_target(node).encode("utf-8"))
        if kind is Kind.BUNDLE or kind is Kind.INDEX:
            with self._lock:
                kept = self._made
                size = self.safetensors(node).size if kind is Kind.BUNDLE else len(self.index_bytes())
                self._made = kept  # a listing needs its size only: made again when opened
                return size
        if kind is Kind.ZARR_CHUNK:
            return chunk_size(node)  # type: ignore[arg-type]
        if isinstance(node, ViewNode):
            return node.view.sizes([node.value])[0]
        if kind is Kind.VALUE:
            return self.value_size(node.value)
        return len(self.content(node))

    def value_size(self, value: Any) -> int:
        """``len(value_bytes(value))``; once per object: one long value may be referenced a million times."""
        if isinstance(value, (bytes, bytearray)):
            return len(value)
        if isinstance(value, str) and value.isascii():
            return len(value) + 1
        cached = self._value_sizes.get(id(value))
        if cached is not None and cached[0] is value:
            return cached[1]
        size = len(value_bytes(value))
        if len(self._value_sizes) >= CACHED_VALUE_SIZES:
            self._value_sizes.clear()
        self._value_sizes[id(value)] = (value, size)
        return size

    def pieces(self, node: Node) -> list[Piece]:
        """What a file holds: a tensor's bytes (its stored extents, or to be gathered), a view's, a value's,
        the index. Opening a tensor's file checks its storage's framing (``Checkpoint.extents``)."""
        if node.kind is Kind.TENSOR:
            tensor: Tensor = node.value
            return tensor_pieces(tensor, self.checkpoint.extents(tensor) if tensor.nbytes else None)
        if isinstance(node, ViewNode):
            return node.view.pieces(node.value)
        if node.kind is Kind.BUNDLE:
            return self.safetensors(node).pieces(self.checkpoint.extents)
        if node.kind is Kind.ZARR_CHUNK:
            return chunk_pieces(node, tensor_pieces(node.value, self.checkpoint.extents(node.value)))  # type: ignore
        return [Literal(self.content(node))]

    def content(self, node: Node) -> bytes | bytearray:
        """The bytes of a view, value or index file, whole."""
        if isinstance(node, ViewNode):
            pieces = node.view.pieces(node.value)
            if all(isinstance(piece, Literal) for piece in pieces):
                return b"".join(piece.data for piece in pieces)  # type: ignore[union-attr]
            raise ValueError(f"{node.name} is not made of generated bytes alone: read its pieces")
        if node.kind is Kind.VALUE:
            return value_bytes(node.value)
        if node.kind is Kind.INDEX:
            return self.index_bytes()
        if node.kind is Kind.ZARR:
            return zarr_document(node)
        raise ValueError(f"{node.kind.value} entries have no generated content")

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
