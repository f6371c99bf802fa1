"""Text from a checkpoint or the command line made safe to print as one line on a terminal.

Control characters (C0, DEL, C1) are written as Python writes them in a
string literal (``\\n``, ``\\t``, ``\\r``, ``\\x1b``, ``\\x85``), and the lone
surrogates that stand for undecodable bytes of a file name as ``\\xNN`` of the
byte; backslashes are left as they are. So a mount point whose name holds a
newline gives a one-line message, and a key cannot move the cursor or
recolour a terminal.
"""

from __future__ import annotations

import re

_UNPRINTABLE = re.compile("[\x00-\x1f\x7f-\x9f\ud800-\udfff]")
_NAMED = {"\n": "\\n", "\t": "\\t", "\r": "\\r"}


def _escape(match: re.Match[str]) -> str:
    char = match.group()
    code = ord(char)
    if char in _NAMED:
        return _NAMED[char]
    if 0xDC80 <= code <= 0xDCFF:  # os.fsdecode's stand-in for the byte code - 0xDC00
        return f"\\x{code - 0xDC00:02x}"
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def printable(text: str) -> str:
    """``text`` with every control character and lone surrogate escaped (see the module docstring)."""
    return _UNPRINTABLE.sub(_escape, text)
