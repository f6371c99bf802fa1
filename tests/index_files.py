"""Reading ``/.ckptfs/index.json`` as a client would: every listed id's file, joined from parents and names."""

from __future__ import annotations

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
