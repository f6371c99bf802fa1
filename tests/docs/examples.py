"""The examples of a Markdown page, as the tests run them.

An example is a fenced block whose language is ``console`` (``$ `` commands, each followed by the output it
shows), ``sh`` (commands, output not shown) or ``python``. Blocks in other languages (``text``, ``ini``) are
not examples. A block right after ``<!-- not run: REASON -->`` is skipped, the reason visible in the source.

The blocks of a page run in order in one directory, as a reader following the page would: mounts made by one
block are there for the next. The directory holds ``examples/tiny_model.pt`` and ``model.pt`` (the same file).
A small runner rather than sybil or doctest: the pages are shell sessions around a real mount, and their
output uses ``...`` lines for the parts a reader need not see, which neither reads without a parser of its own.
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

FENCE = re.compile(r"^```(\w*)\s*$")
NOT_RUN = re.compile(r"^<!-- not run: (.+?) -->\s*$")
RUN_LANGUAGES = ("console", "sh", "python")


@dataclass
class Block:
    language: str
    text: str
    line: int  # of the opening fence, 1-based
    not_run: str | None


def blocks(markdown: str) -> list[Block]:
    """Every fenced block of a page, with its language and whether it is marked as not run."""
    found: list[Block] = []
    lines = markdown.splitlines()
    i = 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if opening is None:
            i += 1
            continue
        end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
        marker = NOT_RUN.match(lines[i - 1]) if i > 0 else None
        found.append(Block(opening.group(1), "\n".join(lines[i + 1:end]) + "\n", i + 1,
                           marker.group(1) if marker else None))
        i = end + 1
    return found


@dataclass
class Command:
    text: str
    expected: list[str]


def console_commands(text: str) -> list[Command]:
    """``$ `` lines (a trailing backslash continues one) and the output lines after each."""
    commands: list[Command] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        if not lines[i].startswith("$ "):
            raise ValueError(f"output before any command: {lines[i]!r}")
        command = lines[i][2:]
        while command.endswith("\\"):
            i += 1
            command = command[:-1] + "\n" + lines[i]
        i += 1
        expected = []
        while i < len(lines) and not lines[i].startswith("$ "):
            expected.append(lines[i])
            i += 1
        commands.append(Command(command, expected))
    return commands


def output_matches(expected: list[str], actual: str) -> bool:
    """Line by line, trailing spaces ignored; a line ``...`` stands for any number of lines, ``...`` in a line
    for any text (paths of the reader's own machine, timings)."""
    pattern = "".join(r"(?:.*\n)*?" if line.strip() == "..." else
                      ".*?".join(map(re.escape, line.rstrip().split("..."))) + r"[ \t]*\n" for line in expected)
    return re.fullmatch(pattern, actual if actual.endswith("\n") or not actual else actual + "\n") is not None


def run_block(block: Block, cwd: Path, env: dict[str, str], python: str) -> None:
    """Runs one example; AssertionError naming the command when it fails or shows other output."""
    if block.language == "python":
        proc = subprocess.run([python, "-c", block.text], cwd=cwd, env=env, capture_output=True, text=True,
                              timeout=120)
        assert proc.returncode == 0, f"python block at line {block.line} failed:\n{proc.stderr[-2000:]}"
        return
    if block.language == "sh":
        commands = [Command(line, []) for line in block.text.splitlines() if line and not line.startswith("#")]
    else:
        commands = console_commands(block.text)
    for command in commands:
        proc = subprocess.run(["bash", "-c", "set -o pipefail; " + command.text], cwd=cwd, env=env,
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, (f"line {block.line}: {command.text!r} exited {proc.returncode}:\n"
                                      f"{proc.stderr[-2000:]}")
        if block.language == "console":
            assert output_matches(command.expected, proc.stdout), (
                f"line {block.line}: {command.text!r} shows\n" + "\n".join(command.expected)
                + f"\nbut printed\n{proc.stdout}")
