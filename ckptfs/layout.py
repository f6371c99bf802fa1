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
* ``/.ckptfs/index.json`` lists every tensor (``path``: its keys as the Python
  API gives them; ``file`` and ``sidecar``: paths relative to the mount root)
  and every other entry (directories, values, links). Each tensor and entry
  has an ``id`` (pre-order; the root directory is 0) and its ``parent``'s id;
  entries give their own ``key`` and ``name`` only, a link its ``target``'s
  id, a value its file's ``size`` (and the ``value`` itself up to 256 bytes),
  so the index grows with the number of entries and not with their depth or size.
* A checkpoint whose root object is not a container (``torch.save(tensor)``)
  shows that object as ``/%root``.

Names
-----
An entry's name is made from its key, one name per key, reversibly given the
container (``child_names``):

* int keys and list/tuple indices: decimal (``0``, ``17``, ``-3``).
* str keys: the key itself, with these characters written as ``%XX`` for
  each of their UTF-8 bytes: ``%``, ``/``, control characters (NUL, newline,
  ESC …, DEL) and lone surrogates; and also
    - a leading ``.``: ``.``, ``..`` and ``.hidden`` become ``%2E``, ``%2E.``, ``%2Ehidden``;
    - the ``.`` of a reserved suffix ``.json``, ``.npy``, ``.safetensors``:
      key ``config.json`` is ``config%2Ejson``;
    - the first character of a key that is an int's name when the same
      container also has that int key: beside int ``7``, str ``'7'`` is
      ``%37``; alone it is ``7`` (a TorchScript ``nn.Sequential``'s
      children ``'0'``, ``'1'`` … are ``0``, ``1`` …).
* any other key (``''``, bool, float, None, tuple, bytes …): ``%=`` and the
  key's JSON (as in the index), escaped the same way: ``%=""``, ``%=true``,
  ``%={"$tuple":[1,2]}``.
* A name longer than 240 bytes keeps its first 200 bytes (never splitting a
  ``%XX`` or a character) and ends with ``%~`` and 16 hex digits of the
  SHA-256 of the whole name; the index holds its key.
* Should two keys of one container still give one name (only a hand-made
  pickle repeats a key), the later entries end with ``%#N``, N the position.

Decoding (``key_of_name``): ``%~`` → see the index; strip ``%#N``; ``%=`` →
JSON; a bare int's name (``0``, ``-3``) → the int key in a list or tuple, and
in a dict or object the int key if the container has it, else the str key
(the index's ``key`` says which); otherwise percent-decode to str.

Names beginning with ``.`` and names ending in a reserved suffix never come
from keys, so ckptfs' own entries cannot collide with them: ``NAME.json``
sidecars, ``/.ckptfs/``, and — reserved for views to come — ``NAME.npy`` next
to each tensor and ``/model.safetensors``.

Inode numbers are stable across mounts of the same file: each container gets
a block of numbers in walk order, four per child (the entry, its sidecar and
two for later views).
"""

from __future__ import annotations

import enum
import json
import re
import threading
from typing import Any, Iterator

from ckptfs.checkpoint import Checkpoint
from ckptfs.collector import gc_paused
from ckptfs.describe import encode_key, encode_leaf
from ckptfs.errors import LimitExceededError
from ckptfs.jsontext import dumps, quote, scalar_text
from ckptfs.model.records import Key, NestedTensor, SparseTensor, Tensor
from ckptfs.pathtext import PathTexts, key_text
from ckptfs.pickle.values import PickledObject
from ckptfs.sidecar import SidecarMaker
from ckptfs.model.tree import children, is_container

META_SUFFIX = ".json"
RESERVED_SUFFIXES = (".json", ".npy", ".safetensors")
CONTROL_DIR = ".ckptfs"
INDEX_NAME = "index.json"
INDEX_VERSION = 2
ROOT_VALUE_NAME = "%root"
MAX_NAME_BYTES = 240
CUT_NAME_BYTES = 200
HASH_DIGITS = 16

ROOT_INO = 1
CONTROL_DIR_INO = 2
INDEX_INO = 3
FIRST_BLOCK_INO = 16
SLOTS = 4
"""Inode numbers per child: the entry, its sidecar, and two kept for later views."""
INLINE_VALUE_BYTES = 256
"""Value files up to this size have their value in the index too (longer ones: read the file)."""
CACHED_VALUE_SIZES = 4096
"""Values whose file sizes ``Layout`` remembers by identity."""
DIR_CACHE_SIZE = 4096
"""Directories ``Layout.lookup`` remembers by path (a path is at most 4 KiB: PATH_MAX)."""

_ESCAPED_CHARS = "[%/\x00-\x1f\x7f\ud800-\udfff]"
_ESCAPED_CHAR = re.compile(_ESCAPED_CHARS)
_INT_NAME = re.compile(r"0|-?[1-9][0-9]*")
"""The names of int keys, ``str(k)``: a str key spelled so is escaped only beside its int."""
_DUPLICATE_SUFFIX = re.compile(r"%#[0-9]+\Z")
_PERCENT_ESCAPE = re.compile("(?:%[0-9A-F]{2})+")


class Kind(enum.Enum):
    DIR = "dir"
    TENSOR = "tensor"
    META = "meta"
    """A tensor's sidecar."""
    VALUE = "value"
    LINK = "link"
    META_LINK = "meta_link"
    """The sidecar of a linked tensor: a link to the sidecar of the tensor's file."""
    INDEX = "index"


class Node:
    """One entry of the mounted tree."""

    __slots__ = ("ino", "kind", "name", "parent", "key", "value", "size")

    def __init__(self, ino: int, kind: Kind, name: str, parent: Dir | None, key: Key, value: Any) -> None:
        self.ino = ino
        self.kind = kind
        self.name = name
        self.parent = parent
        self.key = key
        self.value = value
        """The container, tensor or value shown; for links the object linked to."""
        self.size = -1
        """Cached size in bytes, -1 until asked."""


class Dir(Node):
    """A directory; its entries are made the first time they are asked for."""

    __slots__ = ("entries", "listing", "children")

    def __init__(self, ino: int, name: str, parent: Dir | None, key: Key, value: Any) -> None:
        super().__init__(ino, Kind.DIR, name, parent, key, value)
        self.entries: dict[str, Node] | None = None
        self.listing: list[Node] = []
        """Entries in readdir order: each child, followed by its sidecar if it is a tensor."""
        self.children: list[Node] = []
        """One node per child of the container, by position."""


def entry_name(key: Key, beside_int: bool = False) -> str:
    """The file name of the child with this key (rules in the module docstring), before ``child_names``' checks.

    ``beside_int``: the container also has an int key; a str key spelling its name is then escaped.
    """
    if type(key) is int:
        name = str(key)
    elif type(key) is str and key:
        name = _escape_str(key, beside_int and _INT_NAME.fullmatch(key) is not None)
    else:
        name = "%=" + _escape_chars(json.dumps(encode_key(key), ensure_ascii=False, separators=(",", ":")))
    return _shorten(name) if len(name) > MAX_NAME_BYTES // 4 else name


def child_names(keys: list[Key]) -> list[str]:
    """The names of one container's children, by position: distinct, each reversible given the container."""
    names = [entry_name(key) for key in keys]
    if len(set(names)) == len(names):
        return names
    int_names = {name for name, key in zip(names, keys) if type(key) is int}
    seen: set[str] = set()
    for position, key in enumerate(keys):
        name = names[position]
        if type(key) is str and name in int_names:
            name = entry_name(key, beside_int=True)
        if name in seen:
            name = f"{name}%#{position}"
        seen.add(name)
        names[position] = name
    return names


def key_of_name(name: str, int_key: bool = False) -> Any:
    """The key an entry name stands for, as the index writes keys (JSON); ValueError for shortened names.

    ``int_key``: the name's container is a list or tuple, or has the int key an int's name (``7``) may stand
    for; else such a name stands for a str key.
    """
    if "%~" in name:
        raise ValueError(f"{name!r} is shortened; its key is in {CONTROL_DIR}/{INDEX_NAME}")
    name = _DUPLICATE_SUFFIX.sub("", name)
    if name.startswith("%="):
        return json.loads(_unescape(name[2:]))
    return encode_key(int(name) if int_key and _INT_NAME.fullmatch(name) else _unescape(name))


def _percent(char: str) -> str:
    return "".join(f"%{byte:02X}" for byte in char.encode("utf-8", "surrogatepass"))


def _escape_chars(text: str) -> str:
    return _ESCAPED_CHAR.sub(lambda m: _percent(m.group()), text)


def _escape_str(key: str, beside_int: bool) -> str:
    """A non-empty str key's name. Linear in C (keys can be megabytes long): no per-character Python."""
    plain = _ESCAPED_CHAR.search(key) is None
    if plain and key[0] != "." and not beside_int and not key.endswith(RESERVED_SUFFIXES):
        return key
    text = key if plain else _escape_chars(key)
    dot = next((len(key) - len(suffix) for suffix in RESERVED_SUFFIXES if key.endswith(suffix)), -1)
    if dot >= 0:
        # The suffix's characters are never escaped, so it ends the text as it ends the key.
        at = len(text) - len(key) + dot
        text = text[:at] + "%2E" + text[at + 1 :]
    if dot != 0 and (key[0] == "." or beside_int):
        text = _percent(key[0]) + text[1:]
    return text


def _unescape(name: str) -> str:
    def decode(match: re.Match[str]) -> str:
        return bytes.fromhex(match.group().replace("%", "")).decode("utf-8", "surrogatepass")

    return _PERCENT_ESCAPE.sub(decode, name)


def _shorten(name: str) -> str:
    raw = name.encode("utf-8")
    if len(raw) <= MAX_NAME_BYTES:
        return name
    cut = raw[:CUT_NAME_BYTES].decode("utf-8", "ignore")
    percent = cut.find("%", len(cut) - 2)
    if percent >= 0:
        cut = cut[:percent]
    import hashlib  # here: only long names need it, and loading OpenSSL costs every mount about 3 ms

    return f"{cut}%~{hashlib.sha256(raw).hexdigest()[:HASH_DIGITS]}"


def value_bytes(value: Any) -> bytes:
    """The contents of the file showing a non-tensor, non-container value."""
    if isinstance(value, (bytes, bytearray)):
        return bytes(value)
    if isinstance(value, str):
        text = value
    elif value is None or isinstance(value, (bool, int, float)):
        try:
            text = repr(value)
        except ValueError:  # an int beyond Python's decimal conversion limit
            text = hex(value)
    else:
        text = json.dumps(encode_leaf(value), ensure_ascii=False)
    return (text + "\n").encode("utf-8", "surrogatepass")


def _container_kind(value: Any) -> dict[str, Any]:
    if isinstance(value, dict):
        return {"kind": "dict"}
    if isinstance(value, list):
        return {"kind": "list"}
    if isinstance(value, tuple):
        return {"kind": "tuple"}
    if isinstance(value, SparseTensor):
        return {"kind": "sparse", "layout": value.layout, "size": list(value.size)}
    if isinstance(value, NestedTensor):
        return {"kind": "nested"}
    assert isinstance(value, PickledObject)
    return {"kind": "object", "class": value.class_name}


class Layout:
    """The directory tree of one checkpoint, built lazily, a directory at a time."""

    def __init__(self, checkpoint: Checkpoint) -> None:
        self.checkpoint = checkpoint
        root = checkpoint.root
        self._boxed = not is_container(root)
        top = [root] if self._boxed else root
        self._kids: dict[int, list[tuple[Key, Any]]] = {}
        self._home: dict[int, tuple[Any, int]] = {}
        self._block: dict[int, int] = {}
        self._dirs: dict[str, Dir] = {}
        self._walk(top)
        self.root = Dir(ROOT_INO, "", None, None, top)
        self.control = Dir(CONTROL_DIR_INO, CONTROL_DIR, self.root, None, None)
        index = Node(INDEX_INO, Kind.INDEX, INDEX_NAME, self.control, None, None)
        self.control.entries = {INDEX_NAME: index}
        self.control.listing = [index]
        self._lock = threading.RLock()
        self._index: bytearray | None = None
        self._value_sizes: dict[int, tuple[Any, int]] = {}
        self._paths = PathTexts(checkpoint.limits.max_generated_bytes)
        self._sidecar = SidecarMaker(self._paths)

    def _walk(self, top: Any) -> None:
        """Finds each shared object's first place and gives each container its inode block.

        Pre-order, children in pickle order, like ``tree.walk``: the first place
        found is the path ``Checkpoint`` gives the tensor.
        """
        next_block = FIRST_BLOCK_INO
        stack: list[tuple[Any, Any, int]] = [(top, None, -1)]
        home, kids, block = self._home, self._kids, self._block
        while stack:
            value, parent, index = stack.pop()
            if id(value) in home:
                continue
            home[id(value)] = (parent, index)
            if not is_container(value):
                continue
            pairs = children(value)
            kids[id(value)] = pairs
            block[id(value)] = next_block
            next_block += SLOTS * len(pairs)
            for position in range(len(pairs) - 1, -1, -1):
                child = pairs[position][1]
                if (isinstance(child, Tensor) or is_container(child)) and id(child) not in home:
                    stack.append((child, value, position))

    # -- navigation ------------------------------------------------------------

    def lookup(self, path: str) -> Node | None:
        """The node at an absolute path inside the mount (``/`` is the root), or None."""
        if path == "/":
            return self.root
        parent, _, name = path.rpartition("/")
        directory = self._directory(parent)
        return None if directory is None else self.entries(directory).get(name)

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
        if directory.entries is None:
            with self._lock, gc_paused():
                if directory.entries is None:
                    self._build(directory)
        assert directory.entries is not None
        return directory.entries

    def listing(self, directory: Dir) -> list[Node]:
        self.entries(directory)
        return directory.listing

    def children(self, directory: Dir) -> list[Node]:
        """One node per child of the directory's container, by position: no sidecars, no ``.ckptfs``."""
        self.entries(directory)
        return directory.children

    def _build(self, directory: Dir) -> None:
        container = directory.value
        pairs = self._kids[id(container)]
        base = self._block[id(container)]
        entries: dict[str, Node] = {}
        listing: list[Node] = []
        kids: list[Node] = []
        if directory is self.root:
            entries[CONTROL_DIR] = self.control
            listing.append(self.control)
        names = [ROOT_VALUE_NAME] if self._boxed else child_names([key for key, _ in pairs])
        for position, (key, child) in enumerate(pairs):
            name = names[position]
            node = self._node(directory, position, key, child, name, base + SLOTS * position)
            entries[name] = node
            listing.append(node)
            kids.append(node)
            if isinstance(child, Tensor):
                kind = Kind.META if node.kind is Kind.TENSOR else Kind.META_LINK
                meta = Node(node.ino + 1, kind, name + META_SUFFIX, directory, key, child)
                entries[meta.name] = meta
                listing.append(meta)
        directory.listing = listing
        directory.children = kids
        directory.entries = entries

    def _node(self, directory: Dir, position: int, key: Key, child: Any, name: str, ino: int) -> Node:
        if not (isinstance(child, Tensor) or is_container(child)):
            return Node(ino, Kind.VALUE, name, directory, key, child)
        parent, index = self._home[id(child)]
        if parent is not directory.value or index != position:
            return Node(ino, Kind.LINK, name, directory, key, child)
        if isinstance(child, Tensor):
            return Node(ino, Kind.TENSOR, name, directory, key, child)
        return Dir(ino, name, directory, key, child)

    def node_of(self, value: Any) -> Node:
        """The node showing a tensor or container at its first place."""
        positions: list[int] = []
        while value is not self.root.value:
            value, index = self._home[id(value)]
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
        target = self.node_of(node.value)
        here = _ancestry(node.parent)
        there = _ancestry(target)
        common = 0
        while common < min(len(here), len(there)) and here[common] is there[common]:
            common += 1
        parts = [".."] * (len(here) - common) + [n.name for n in there[common:]]
        path = "/".join(parts) or "."
        return path + META_SUFFIX if node.kind is Kind.META_LINK else path

    # -- contents ----------------------------------------------------------------

    def size(self, node: Node) -> int:
        if node.size < 0:
            node.size = self._size(node)
        return node.size

    def sizes(self, nodes: list[Node]) -> list[int]:
        """``[self.size(node) for node in nodes]``, the sidecars' made together: listings need every one."""
        metas = [node for node in nodes if node.size < 0 and node.kind is Kind.META]
        for node, size in zip(metas, self._sidecar.sizes([node.value for node in metas])):
            node.size = size
        return [node.size if node.size >= 0 else self.size(node) for node in nodes]

    def _size(self, node: Node) -> int:
        kind = node.kind
        if kind is Kind.TENSOR:
            tensor: Tensor = node.value
            return tensor.nbytes if tensor.has_data else 0
        if kind is Kind.DIR:
            return 0
        if kind is Kind.LINK or kind is Kind.META_LINK:
            return len(self.link_target(node).encode("utf-8"))
        if kind is Kind.META:
            return self._sidecar.size(node.value)
        if kind is Kind.VALUE:
            return self._value_size(node.value)
        return len(self.content(node))

    def _value_size(self, value: Any) -> int:
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

    def content(self, node: Node) -> bytes | bytearray:
        """The bytes of a sidecar, value or index file."""
        if node.kind is Kind.META:
            return self._sidecar(node.value)
        if node.kind is Kind.VALUE:
            return value_bytes(node.value)
        if node.kind is Kind.INDEX:
            return self.index_bytes()
        raise ValueError(f"{node.kind.value} entries have no generated content")

    def index_bytes(self) -> bytearray:
        """The index (made on first use); a bytearray not to be changed: the text is not copied to a bytes."""
        with self._lock, gc_paused():
            if self._index is None:
                self._index = self._make_index()
            return self._index

    def _make_index(self) -> bytearray:
        """One pre-order pass over the tree: tensors (in pickle order) and every other entry, a JSON object a line.

        Entries name their parent by id rather than repeating their key path, so
        the index grows with the number of entries, not with their depth. A
        tensor's ``path`` and ``file`` are spelled out: joined from texts made
        once per directory, not re-encoded key by key.
        """
        ck = self.checkpoint
        budget = ck.limits.max_generated_bytes
        head = {"ckptfs_index": INDEX_VERSION, "source": ck.path, "format": ck.format, "byteorder": ck.byteorder,
                "tensor_count": len(ck.tensors)}
        # Lines go straight into two buffers, the index itself (head and tensors) and the other entries.
        tensors = bytearray(dumps(head)[:-1].encode() + b',\n"tensors": [\n')
        entries = bytearray()
        root_kind = {"kind": "dir"} if self._boxed else _container_kind(self.root.value)
        entries += (dumps({"id": 0, "name": "", **root_kind}) + ",\n").encode()
        ids: dict[int, int] = {} if self._boxed else {id(self.root.value): 0}
        next_id = 1
        # Per open directory: its children, its id, and the names on the way to it.
        stack: list[tuple[Iterator[Node], int, list[str]]] = [(iter(self.children(self.root)), 0, [])]
        last_folders, folder_text = stack[0][2], '"'
        shape_texts: dict[tuple[int, ...], str] = {}
        while stack:
            nodes, parent_id, folders = stack[-1]
            node = next(nodes, None)
            if node is None:
                stack.pop()
                continue
            kind = node.kind
            if len(tensors) + len(entries) > budget:
                raise LimitExceededError(f"{INDEX_NAME} would exceed {budget} bytes (limit max_generated_bytes)")
            node_id, next_id = next_id, next_id + 1
            if kind is Kind.TENSOR or isinstance(node, Dir):
                ids[id(node.value)] = node_id
            if kind is Kind.TENSOR:
                tensor: Tensor = node.value
                if folders is not last_folders:
                    # JSON text without its closing quote: escaping is per character, so it joins with the name's.
                    last_folders, folder_text = folders, dumps("".join(name + "/" for name in folders))[:-1]
                name = quote(node.name)[1:]
                shape = shape_texts.get(tensor.shape)
                if shape is None:
                    shape = shape_texts[tensor.shape] = dumps(list(tensor.shape))
                tensors += (f'{{"id": {node_id}, "parent": {parent_id}, "path": {self._paths.path_text(tensor.trail)}, '
                            f'"file": {folder_text}{name}, "sidecar": {folder_text}{name[:-1]}{META_SUFFIX}", '
                            f'"dtype": {quote(tensor.dtype.name)}, "shape": {shape}, '
                            f'"nbytes": {tensor.nbytes}}},\n').encode()
                continue
            line = f'{{"id": {node_id}, "parent": {parent_id}, "name": {quote(node.name)}'
            if not (self._boxed and node.parent is self.root):
                line += ', "key": ' + key_text(node.key)
            if isinstance(node, Dir):
                line += ", " + dumps(_container_kind(node.value))[1:]
                stack.append((iter(self.children(node)), node_id, [*folders, node.name]))
            elif kind is Kind.LINK:
                line += f', "kind": "link", "target": {ids[id(node.value)]}}}'
            else:
                size = self._value_size(node.value)
                shown = f'"value": {scalar_text(encode_leaf(node.value))}' if size <= INLINE_VALUE_BYTES else ""
                line += f', "kind": "value", "size": {size}{", " if shown else ""}{shown}}}'
            entries += (line + ",\n").encode()
        if ck.tensors:
            del tensors[-2:]
        tensors += b'\n],\n"entries": [\n'
        tensors += memoryview(entries)[:-2]
        tensors += b"\n]}\n"
        return tensors


def _ancestry(node: Node | None) -> list[Node]:
    """The nodes from the root down to ``node``, both included."""
    chain: list[Node] = []
    while node is not None:
        chain.append(node)
        node = node.parent
    chain.reverse()
    return chain
