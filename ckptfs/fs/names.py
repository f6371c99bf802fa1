"""Entry names: one name per key, reversible given the container.

Names
-----
An entry's name is made from its key, one name per key, reversibly given the
container (``child_names``):

* int keys and list/tuple indices: decimal (``0``, ``17``, ``-3``).
* str keys: the key itself, with these characters written as ``%XX`` for
  each of their UTF-8 bytes: ``%``, ``/``, control characters (NUL, newline,
  ESC …, DEL) and lone surrogates; and also
    - a leading ``.``: ``.``, ``..`` and ``.hidden`` become ``%2E``, ``%2E.``, ``%2Ehidden``;
    - the ``.`` of a reserved suffix ``.json``, ``.q_scales``, ``.q_zero_points``, ``.npy``,
      ``.safetensors``: key ``config.json`` is ``config%2Ejson``;
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
sidecars, ``NAME.npy`` views, a per-channel quantized tensor's ``NAME.q_scales``
and ``NAME.q_zero_points``, ``model.safetensors``, ``/.ckptfs/`` and ``/.zarr/``.
"""

from __future__ import annotations

import json
import re
from operator import methodcaller
from typing import Any

from ckptfs.model.encoding import encode_key
from ckptfs.model.jsontext import text_chunks
from ckptfs.model.records import Key

CONTROL_DIR = ".ckptfs"
INDEX_NAME = "index.json"
RESERVED_SUFFIXES = (".json", ".q_scales", ".q_zero_points", ".npy", ".safetensors")
ROOT_VALUE_NAME = "%root"
MAX_NAME_BYTES = 240
CUT_NAME_BYTES = 200
HASH_DIGITS = 16


_ESCAPED_CHARS = "[%/\x00-\x1f\x7f\ud800-\udfff]"
_ESCAPED_CHAR = re.compile(_ESCAPED_CHARS)
_INT_NAME = re.compile(r"0|-?[1-9][0-9]*")
"""The names of int keys, ``str(k)``: a str key spelled so is escaped only beside its int."""
_PLAIN_ASCII = bytes(c for c in range(128) if not _ESCAPED_CHAR.match(chr(c)))
"""The ASCII characters a name holds as they are: a text of them only is left empty by deleting them."""
_STARTS_WITH_DOT = methodcaller("startswith", ".")
_ENDS_RESERVED = methodcaller("endswith", RESERVED_SUFFIXES)
_DUPLICATE_SUFFIX = re.compile(r"%#[0-9]+\Z")
_PERCENT_ESCAPE = re.compile("(?:%[0-9A-F]{2})+")



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


def child_names(keys: list[Key], distinct: bool = False) -> list[str]:
    """The names of one container's children, by position: distinct, each reversible given the container.
    ``distinct``: the keys are (a dict's): plain keys named as they are then need no check of that."""
    names = _plain_names(keys)
    if names is keys and distinct:
        return names
    names = [entry_name(key) for key in keys] if names is None else list(names)  # a list of its own, to change
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


def _plain_names(keys: list[Key]) -> list[str] | None:
    """``[entry_name(key) for key in keys]`` where every key is a str that no rule escapes (a state dict's), else
    None: checked a column at a time, one pass over all the keys' text rather than a search per key (a listing of
    200,000 tensors' names)."""
    if not keys or set(map(type, keys)) != {str} or not min(map(len, keys)):
        return None
    for chunk in text_chunks(len(keys)):
        text = "".join(keys[chunk])  # type: ignore[arg-type]
        if text.encode("ascii").translate(None, _PLAIN_ASCII) if text.isascii() else _ESCAPED_CHAR.search(text):
            return None
    if any(map(_STARTS_WITH_DOT, keys)) or any(map(_ENDS_RESERVED, keys)):
        return None
    if max(map(len, keys)) <= MAX_NAME_BYTES // 4:
        return keys  # type: ignore[return-value]  # named as they are: the list itself, not a copy
    names: list[str] = list(keys)  # type: ignore[arg-type]
    for position, length in enumerate(map(len, names)):
        if length > MAX_NAME_BYTES // 4:
            names[position] = _shorten(names[position])
    return names


def only_str_key(name: str) -> bool:
    """Whether no key but the str key spelled as ``name`` can have that name, in any container: ``name`` is
    neither escaped, shortened nor an int's name. ``child_names`` renames such a key only beside a key of the same
    name, which a dict cannot hold."""
    return bool(name) and _INT_NAME.fullmatch(name) is None and entry_name(name) == name


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
