"""Reading ``/.ckptfs/index.json`` as a client would: every listed id's file, joined from parents and names."""

from __future__ import annotations

import json
from typing import Any


def files_by_id(index: dict[str, Any]) -> dict[int, str]:
    """Each tensor's and entry's path relative to the mount root (``.`` for the root directory, id 0)."""
    files = {0: "."}
    for entry in index["entries"][1:]:  # pre-order: a directory comes before its entries
        parent = files[entry["parent"]]
        files[entry["id"]] = entry["name"] if parent == "." else f"{parent}/{entry['name']}"
    for tensor in index["tensors"]:
        parent = files[tensor["parent"]]
        assert tensor["file"] == (tensor["file"].rpartition("/")[2] if parent == "." else
                                  f"{parent}/{tensor['file'].rpartition('/')[2]}")
        files[tensor["id"]] = tensor["file"]
    return files


def file_of_path(index: dict[str, Any], path: list[Any]) -> str:
    """The file of a key path (keys as the index writes them), following links: any path of a shared object."""
    if not path:  # the root object itself: a tensor, shown as %root
        return next(t["file"] for t in index["tensors"] if t["path"] == [])
    files = files_by_id(index)
    child: dict[tuple[int, str], dict[str, Any]] = {}
    for entry in index["entries"][1:]:
        child[(entry["parent"], json.dumps(entry.get("key")))] = entry
    for tensor in index["tensors"]:
        child[(tensor["parent"], json.dumps(tensor["path"][-1] if tensor["path"] else None))] = tensor
    at, names = 0, []
    for key in path:
        entry = child[(at, json.dumps(key))]
        names.append(files[entry["id"]].rpartition("/")[2])
        at = entry.get("target", entry["id"])
    return "/".join(names) or "."
