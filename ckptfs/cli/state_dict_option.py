"""``--state-dict``: a whole pickled ``nn.Module`` named as its ``state_dict()`` (``seq.0.weight``) rather than by
its attributes (``_modules/seq/_modules/0/_parameters/weight``)."""

from __future__ import annotations

import argparse
import contextlib
import sys
from typing import Iterator

from ckptfs.checkpoint import Checkpoint, open_checkpoint
from ckptfs.cli.cache_options import cache_dir
from ckptfs.cli.remote_options import remote_options


def add_state_dict_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--state-dict", action="store_true",
                        help="a whole pickled nn.Module (torch.save(model)) as its state_dict(): dotted names, "
                             "parameters and persistent buffers only (other checkpoints are shown as they are)")


def viewed(ck: Checkpoint, args: argparse.Namespace) -> Checkpoint:
    """``ck``, as its module's state dict with ``--state-dict`` when it is a pickled ``nn.Module``."""
    return ck.as_state_dict() if args.state_dict else ck


@contextlib.contextmanager
def opened(args: argparse.Namespace, path: str) -> Iterator[Checkpoint]:
    """The checkpoint a command names, with the command's limits, remote and cache options, and ``--state-dict``.
    A parse the cache keeps is written to it once the command is done, from a process the command does not wait
    for; not after Ctrl-C."""
    with open_checkpoint(path, args.limits, remote_options(args), cache_dir(args), save_later=True) as ck:
        try:
            yield viewed(ck, args)
        finally:
            if not isinstance(sys.exc_info()[1], KeyboardInterrupt):
                ck.save_parse_in_background()
