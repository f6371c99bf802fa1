"""What ``ckptfs info`` prints: a summary; with ``--json``, every tensor's metadata and the whole tree.

The JSON can be far bigger than the file: a long string referenced a
million times, or 10,000 tensors 990 keys deep. Its size is counted while it
is put together and refused past ``max_generated_bytes`` before the text is
made; each tensor's metadata is its sidecar's text (templates and cached key
paths), not re-encoded value by value, which would take seconds for such a file.
"""

from __future__ import annotations

import os
import re
from typing import Any

from ckptfs.checkpoint import Checkpoint
from ckptfs.describe import TextBudget, encode_tree, json_text
from ckptfs.errors import CkptfsError
from ckptfs.jsontext import dumps
from ckptfs.model.records import Tensor
from ckptfs.pathtext import PathTexts
from ckptfs.sidecar import SidecarMaker


def summary(ck: Checkpoint) -> dict[str, Any]:
    """What ``ckptfs info`` prints."""
    return {
        "file": ck.path,
        "format": ck.format,
        "byteorder": ck.byteorder,
        "details": ck.details,
        "tensor_count": len(ck.tensors),
        "total_nbytes": sum(t.nbytes for t in ck.tensors),
    }


def description_text(ck: Checkpoint) -> str:
    """``ckptfs info --json``: the JSON text of the summary, every tensor's metadata and the whole tree.

    It equals ``json_text({**summary(ck), "tensors": [tensor_metadata(t) ...], "tree": encode_tree(ck.root)})``.
    LimitExceededError (naming the file) past ``max_generated_bytes``.
    """
    budget = TextBudget(ck.limits.max_generated_bytes)
    sidecars = SidecarMaker(PathTexts(ck.limits.max_generated_bytes))
    try:
        tensors = []
        for tensor in ck.tensors:
            text = sidecars(tensor).decode("ascii")[:-1]
            budget.spend(2 * len(text))  # in the tensor list, and once more in the tree
            tensors.append(text)
        # Each tensor of the tree stands as a marker no checkpoint can contain, replaced by its text at the end.
        marker = f"\x00ckptfs:tensor:{os.urandom(16).hex()}:"
        index = {id(tensor): n for n, tensor in enumerate(ck.tensors)}

        def stand_in(tensor: Tensor) -> str:
            return marker + str(index[id(tensor)])

        tree = json_text(encode_tree(ck.root, budget, stand_in))
    except CkptfsError as exc:
        raise exc.with_path(ck.path) from None
    quoted = re.escape(dumps(marker)[:-1]) + r'(\d+)"'
    tree = re.sub(quoted, lambda match: tensors[int(match.group(1))], tree)
    return f'{dumps(summary(ck))[:-1]}, "tensors": [{", ".join(tensors)}], "tree": {tree}}}'
