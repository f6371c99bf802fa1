"""``--state-dict``: a whole pickled ``nn.Module`` named as its ``state_dict()`` (``seq.0.weight``) rather than by
its attributes (``_modules/seq/_modules/0/_parameters/weight``)."""

from __future__ import annotations

import argparse

from ckptfs.checkpoint import Checkpoint
from ckptfs.errors import CkptfsError
from ckptfs.model.state_dict import state_dict


def add_state_dict_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--state-dict", action="store_true",
                        help="a whole pickled nn.Module (torch.save(model)) as its state_dict(): dotted names, "
                             "parameters and persistent buffers only (other checkpoints are shown as they are)")


def viewed(ck: Checkpoint, args: argparse.Namespace) -> Checkpoint:
    """``ck``, as its module's state dict with ``--state-dict`` when it is a pickled ``nn.Module``."""
    return state_dict_view(ck) if args.state_dict else ck


def state_dict_view(ck: Checkpoint) -> Checkpoint:
    try:
        named = state_dict(ck.root, ck.limits)
    except CkptfsError as exc:
        raise exc.with_path(ck.path) from None
    return ck if named is None else ck.with_root(named)
