"""Writes examples/tiny_model.pt, the small checkpoint the README's demo mounts.

Needs torch (a test dependency): `.venv/bin/python scripts/make_example.py`.
The output is committed, so the demo itself runs without torch.
"""

from __future__ import annotations

import pathlib

import torch

OUT = pathlib.Path(__file__).resolve().parent.parent / "examples" / "tiny_model.pt"


class TinyMLP(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(16, 8)
        self.layers = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 4))
        self.norm = torch.nn.LayerNorm(4)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.norm(self.layers(self.embed(tokens)))


def main() -> None:
    torch.manual_seed(0)
    model = TinyMLP()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.arange(4)).sum().backward()
    optimizer.step()
    checkpoint = {
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "epoch": 3,
        "config": {"hidden": 8, "vocab": 16, "name": "tiny-mlp"},
    }
    OUT.parent.mkdir(exist_ok=True)
    torch.save(checkpoint, OUT)
    print(f"wrote {OUT} ({OUT.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
