"""What ``--help`` shows beyond the options: each command's examples, the limits (``--help-limits``, once), and
the texts the manual pages share with it.

Every example runs as written in a directory holding ``model.pt``, ``before.pt`` and ``after.pt``, with
``/mnt/m`` an empty directory (tests/docs/test_help.py runs them against examples/tiny_model.pt).
"""

from __future__ import annotations

import argparse
from typing import Any, NoReturn, Sequence

from ckptfs.limits import SUMMARIES, UNITS_HELP, Limits, format_quantity

EXAMPLES = {
    "ckptfs": """\
examples:
  ckptfs ls model.pt                          # every tensor: its file in a mount, dtype, shape, size
  ckptfs ls --json model.pt | head -3         # the same, one JSON object a line
  ckptfs info model.pt                        # sizes, tensors, element count, dtypes, format
  ckptfs info --json --indent 2 model.pt      # every tensor's metadata and the whole object tree
  ckptfs cat model.pt model.embed.weight | sha256sum      # one tensor's bytes
  ckptfs diff before.pt after.pt              # which tensors differ, and by how much
  ckptfs mount model.pt /mnt/m                # a directory of per-tensor files
  ckptfs umount /mnt/m
  ckptfs convert model.pt model.safetensors   # the tensors as one safetensors file (also --to npz, dir, pt)
  ckptfs --limit max_pickle_bytes=2GiB ls model.pt
  ckptfs --help-limits                        # the safety limits and their defaults""",
    "ls": """\
examples:
  ckptfs ls model.pt
  ckptfs ls --json model.pt | grep '"float32"' | head -2
  ckptfs ls --nest model.pt
  ckptfs ls model.pt --limit max_pickle_bytes=1GiB""",
    "info": """\
examples:
  ckptfs info model.pt
  ckptfs info --json model.pt | head -c 200; echo
  ckptfs info --json --indent 2 model.pt --limit max_generated_bytes=1GiB""",
    "cat": """\
examples:
  ckptfs cat model.pt model.embed.weight | od -A d -t f4 | head -3
  ckptfs cat model.pt model/layers.0.weight -o w.bin     # a file as ckptfs ls prints it
  ckptfs cat model.pt model/layers/0.weight -o w.bin     # as ckptfs ls --nest prints it
  ckptfs cat --npy model.pt model.embed.weight -o embed.npy   # then np.load("embed.npy")""",
    "diff": """\
examples:
  ckptfs diff before.pt after.pt
  ckptfs diff --quick before.pt after.pt && echo same
  ckptfs diff --json before.pt after.pt | tail -1""",
    "convert": """\
examples:
  ckptfs convert model.pt model.safetensors
  ckptfs convert model.pt weights.npz
  ckptfs convert --to dir model.pt weights
  ckptfs convert model.pt resaved.pt      # a torch.save archive (from any source: DCP, .pt2, legacy, URLs)""",
    "mount": """\
examples:
  ckptfs mount model.pt /mnt/m
  ckptfs mount -o views=json,npy model.pt /mnt/m    # no model.safetensors, no /.zarr
  ckptfs mount --nest --log-file ~/ckptfs.log model.pt /mnt/m
  ckptfs mount -o uid=0,umask=022 model.pt /mnt/m   # files owned by root, mode 0555/0444 less 022
  ckptfs mount -o rw skeleton.pt /mnt/m             # tensors' files take writes, in place""",
    "fill": """\
examples:
  ckptfs fill skeleton.pt --from trained.pt         # trained.pt's tensors into skeleton.pt's storages""",
    "umount": """\
examples:
  ckptfs umount /mnt/m
  ckptfs umount -l /mnt/m     # now, although files in it are open""",
    "mounts": """\
examples:
  ckptfs mounts
  ckptfs mounts --json""",
}
LIMITS_POINTER = "limits: ckptfs --help-limits lists the safety limits, their defaults and how to raise them"


def limits_help() -> str:
    """Every limit with its default."""
    defaults = {name: f"{name}={format_quantity(value, name.endswith('_bytes'))}"
                for name, value in Limits.defaults().items()}
    width = max(map(len, defaults.values()))
    lines = [f"  {defaults[name]:<{width}}  {SUMMARIES[name]}" for name in Limits.names()]
    return ("limits, with their defaults (raise one with --limit NAME=VALUE, before or after the command;\n"
            f"VALUE is {UNITS_HELP}):\n" + "\n".join(lines))


class HelpFormatter(argparse.HelpFormatter):
    """Wraps one-paragraph texts; keeps texts laid out by hand (epilogs of examples and limits) as they are."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        if "\n" in text:
            return "".join(indent + line for line in text.splitlines(keepends=True))
        return super()._fill_text(text, width, indent)


class HelpLimits(argparse.Action):
    """``--help-limits``: the limits table, then exit."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS,
                         help="list the safety limits with their defaults and exit", **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> NoReturn:
        print(limits_help())
        parser.exit()
