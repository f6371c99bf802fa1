"""Figures (per side, per run), the checks on their ratios, and the table and JSON made of them."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Figure:
    key: str
    label: str
    unit: str  # "GB/s", "s", "us", "MiB"
    values: dict[str, list[float]] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)

    def add(self, side: str, value: float) -> None:
        self.values.setdefault(side, []).append(value)

    def median(self, side: str) -> float | None:
        vals = self.values.get(side)
        return statistics.median(vals) if vals else None


@dataclass
class Check:
    figure: str
    num: str
    den: str | None  # None: an absolute target on num's value
    op: str  # ">=" or "<="
    target: float | None
    label: str


SIDE_NOTES = {
    "raw": "raw = .pt byte range read directly",
    "cpass": "cpass = C libfuse3 pass-through",
    "clist": "clist = C libfuse3 file system listing the root entries ckptfs lists",
    "cll": "cll = clist on libfuse3's low-level API (no node table, no paths, no opendir)",
    "cpickle": "cpickle = Python process reading the pickle with the C unpickler",
    "floor": "floor = cpickle + clist",
    "ckptfs": "ckptfs = tensor file of ckptfs mount",
    "alt": "alt = ckptfs from --alt-root/--alt-env",
    "ratar": "ratar = ratarmount",
    "torch": "torch = torch.load(+mmap) and listing",
}
"""What each side (a column of the table) is; a section with sides of its own adds theirs to ``side_notes``."""


class Results:
    def __init__(self) -> None:
        self.side_notes = dict(SIDE_NOTES)
        self.figures: dict[str, Figure] = {}
        self.checks: list[Check] = []
        self.meta: dict[str, Any] = {}

    def fig(self, key: str, label: str, unit: str) -> Figure:
        if key not in self.figures:
            self.figures[key] = Figure(key, label, unit)
        return self.figures[key]

    def ratio_runs(self, c: Check) -> list[float]:
        f = self.figures.get(c.figure)
        if f is None or c.num not in f.values:
            return []
        if c.den is None:
            return list(f.values[c.num])
        if c.den not in f.values:
            return []
        return [a / b for a, b in zip(f.values[c.num], f.values[c.den]) if b]

    def evaluate(self, c: Check) -> tuple[float | None, bool | None]:
        vals = self.ratio_runs(c)
        if not vals:
            return None, None
        med = statistics.median(vals)
        if c.target is None:
            return med, None
        return med, (med >= c.target if c.op == ">=" else med <= c.target)

    def to_json(self) -> dict[str, Any]:
        figs = {}
        for key, f in self.figures.items():
            figs[key] = {
                "label": f.label,
                "unit": f.unit,
                "sides": {s: {"runs": v, "median": statistics.median(v)} for s, v in f.values.items() if v},
                **({"extra": f.extra} if f.extra else {}),
            }
        checks = []
        for c in self.checks:
            med, met = self.evaluate(c)
            if med is None:
                continue
            checks.append({
                "figure": c.figure, "label": c.label, "numerator": c.num, "denominator": c.den,
                "runs": self.ratio_runs(c), "median": med,
                "target": None if c.target is None else f"{c.op} {c.target}", "met": met,
            })
        return {"meta": self.meta, "figures": figs, "checks": checks}


def fmt_value(v: float | None, unit: str) -> str:
    if v is None:
        return "-"
    if unit == "GB/s":
        return f"{v:.2f} GB/s"
    if unit == "s":
        return f"{v * 1000:.0f} ms" if v < 10 else f"{v:.1f} s"
    if unit == "us":
        return f"{v:.1f} us"
    if unit == "MiB":
        return f"{v:.1f} MiB"
    return f"{v:.3g} {unit}"


def render_table(res: Results) -> str:
    sides = ["raw", "cpass", "clist", "cpickle", "floor", "tensorfile", "ckptfs", "alt", "ratar", "cp", "torch"]
    sides += [s for s in res.side_notes if s not in sides]  # a section's own sides, after these
    present = [s for s in sides if any(s in f.values for f in res.figures.values())]
    lines = []
    head = ["figure"] + present
    rows = []
    for f in res.figures.values():
        rows.append([f.label] + [fmt_value(f.median(s), f.unit) for s in present])
    widths = [max(len(r[i]) for r in rows + [head]) for i in range(len(head))]
    lines.append("Medians (%s):" % ", ".join(res.side_notes[s] for s in present))
    lines.append("  ".join(h.ljust(w) for h, w in zip(head, widths)))
    lines.append("  ".join("-" * w for w in widths))
    for r in rows:
        lines.append("  ".join(c.ljust(w) for c, w in zip(r, widths)))
    lines.append("")
    lines.append("Ratios (median of per-run ratios) against targets:")
    crow = [["check", "median", "target", "met"]]
    for c in res.checks:
        med, met = res.evaluate(c)
        if med is None:
            continue
        unit = res.figures[c.figure].unit
        shown = fmt_value(med, unit) if c.den is None else f"{med:.3f}x"
        target = "-" if c.target is None else (
            f"{c.op} {fmt_value(c.target, unit)}" if c.den is None else f"{c.op} {c.target}x")
        crow.append([c.label, shown, target, "-" if met is None else ("yes" if met else "NO")])
    widths = [max(len(r[i]) for r in crow) for i in range(4)]
    for i, r in enumerate(crow):
        lines.append("  ".join(c.ljust(w) for c, w in zip(r, widths)))
        if i == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


