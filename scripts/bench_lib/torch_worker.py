"""The torch side of scripts/bench, run as a separate process so the benchmark itself stays torch-free.

Reads one JSON command per line on stdin and answers one JSON line on stdout:

  {"op": "make_big", "path": P, "nbytes": N}            one float32 tensor of N bytes
  {"op": "make_many", "path": P, "count": N, "legacy": B}  N small tensors, mixed dtypes
  {"op": "make_moe", "path": P, "count": N}              N small tensors named like a mixture of experts
  {"op": "make_values", "path": P, "count": N, "kind": K}  about N plain values (flat or nested), no tensor
  {"op": "load", "path": P, "mmap": B}                   torch.load (weights_only) + names and shapes
  {"op": "quit"}
"""

from __future__ import annotations

import gc
import json
import random
import sys
import time

T_IMPORT = time.perf_counter()
import torch  # noqa: E402

IMPORT_S = time.perf_counter() - T_IMPORT
torch.set_num_threads(1)

BIG_NAME = "model.embed_tokens.weight"

# (suffix, dtype, shape) of one transformer layer, named like a large model's state dict.
LAYER = [
    ("input_layernorm.weight", torch.float32, (64,)),
    ("self_attn.q_proj.weight", torch.bfloat16, (16, 16)),
    ("self_attn.q_proj.bias", torch.bfloat16, (16,)),
    ("self_attn.k_proj.weight", torch.bfloat16, (8, 16)),
    ("self_attn.k_proj.bias", torch.float16, (8,)),
    ("self_attn.v_proj.weight", torch.float16, (8, 16)),
    ("self_attn.o_proj.weight", torch.float32, (16, 16)),
    ("self_attn.rotary_emb.inv_freq", torch.float64, (8,)),
    ("mlp.gate_proj.weight", torch.int8, (32, 16)),
    ("mlp.up_proj.weight", torch.uint8, (32, 16)),
    ("mlp.down_proj.weight", torch.float32, (16, 32)),
    ("post_attention_layernorm.weight", torch.float32, (16,)),
]
EXTRA = [
    ("model.embed_tokens.weight", torch.float32, (64, 16)),
    ("model.norm.weight", torch.float32, (16,)),
    ("lm_head.weight", torch.bfloat16, (64, 16)),
    ("model.position_ids", torch.int64, (1, 64)),
]


def _tensor(dtype: torch.dtype, shape: tuple[int, ...], gen: torch.Generator) -> torch.Tensor:
    if dtype.is_floating_point:
        return torch.randn(shape, generator=gen, dtype=torch.float32).to(dtype)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=gen).bool()
    lo, hi = (0, 255) if dtype == torch.uint8 else (-100, 100)
    return torch.randint(lo, hi, shape, generator=gen).to(dtype)


def make_many(count: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(1)
    sd: dict[str, torch.Tensor] = {}
    layers = (count - len(EXTRA)) // len(LAYER)
    sd[EXTRA[0][0]] = _tensor(EXTRA[0][1], EXTRA[0][2], gen)
    for i in range(layers):
        for suffix, dtype, shape in LAYER:
            sd[f"model.layers.{i}.{suffix}"] = _tensor(dtype, shape, gen)
    for name, dtype, shape in EXTRA[1:]:
        sd[name] = _tensor(dtype, shape, gen)
    extra_dtypes = [torch.bool, torch.int32, torch.int16, torch.float64]
    j = 0
    while len(sd) < count:
        sd[f"model.buffers.{j}.mask"] = _tensor(extra_dtypes[j % len(extra_dtypes)], (4, 4), gen)
        j += 1
    assert len(sd) == count, (len(sd), count)
    return sd


MOE_EXPERTS = 64
MOE_DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.int8]
MOE_SHAPES = [(8, 4), (4, 8), (8,)]


def make_moe(count: int) -> dict[str, torch.Tensor]:
    """``model.layers.L.mlp.experts.E.wK.weight`` (K in 1..3), a router per layer, in layer order; dtypes cycle
    through fp32/bf16/fp16/int8. Values come from a seeded generator: the file is the same at every run."""
    gen = torch.Generator().manual_seed(2)
    sd: dict[str, torch.Tensor] = {}
    layer = 0
    while len(sd) < count:
        names = [f"model.layers.{layer}.mlp.gate.weight"] + [
            f"model.layers.{layer}.mlp.experts.{e}.w{k}.weight" for e in range(MOE_EXPERTS) for k in (1, 2, 3)]
        for name in names[: count - len(sd)]:
            i = len(sd)
            sd[name] = _tensor(MOE_DTYPES[i % len(MOE_DTYPES)], MOE_SHAPES[i % len(MOE_SHAPES)], gen)
        layer += 1
    return sd


def make_values(count: int, kind: str) -> dict:
    """Plain values only, each shown as a small file. ``flat``: one list of ``count - 2`` floats (a loss history,
    9 pickle bytes each) beside two scalars: ``count`` value files in one directory. ``nested``: an optimizer-like
    state, per parameter a dict of floats, an int, a bool, a str, None and a two-int shape list (11 value files
    with its id in the groups' list and its loss), about ``count`` in all. Seeded: the same at every run."""
    rng = random.Random(3)
    if kind == "flat":
        return {"losses": [rng.random() for _ in range(count - 2)], "epoch": 3, "lr": 1e-3}
    groups = ("attn", "mlp", "norm", "embed")
    n = count // 11
    state = {i: {"lr": rng.choice([1e-4, 3e-4, 1e-3]) * rng.random(), "weight_decay": round(rng.random() * 0.1, 4),
                 "step": rng.randrange(1 << 20), "frozen": rng.random() < 0.1,
                 "dtype": rng.choice(["bfloat16", "float32"]),
                 "shape": [rng.choice([64, 128, 4096]), rng.choice([64, 4096, 11008])], "note": None,
                 "name": f"layers.{i // 4}.{groups[i % 4]}"} for i in range(n)}
    return {"state": state,
            "param_groups": [{"lr": 3e-4, "betas": (0.9, 0.95), "eps": 1e-8, "params": list(range(n))}],
            "loss_history": [rng.random() for _ in range(n)], "tokens": b"\x00\x01tok", "epoch": 3}


def handle(cmd: dict) -> dict:
    op = cmd["op"]
    if op == "make_big":
        gen = torch.Generator().manual_seed(0)
        cols = 1024
        rows = cmd["nbytes"] // (4 * cols)
        t = torch.randn((rows, cols), generator=gen, dtype=torch.float32)
        torch.save({BIG_NAME: t}, cmd["path"])
        result = {"name": BIG_NAME, "shape": [rows, cols], "nbytes": t.numel() * 4, "sum": float(t.double().sum())}
        del t
        gc.collect()
        return result
    if op == "make_many":
        sd = make_many(cmd["count"])
        if cmd.get("legacy"):
            torch.save(sd, cmd["path"], _use_new_zipfile_serialization=False)
        else:
            torch.save(sd, cmd["path"])
        return {"count": len(sd)}
    if op == "make_moe":
        sd = make_moe(cmd["count"])
        torch.save(sd, cmd["path"])
        return {"count": len(sd)}
    if op == "make_values":
        torch.save(make_values(cmd["count"], cmd["kind"]), cmd["path"])
        return {}
    if op == "load":
        gc.collect()
        t0 = time.perf_counter()
        if cmd.get("mmap"):
            sd = torch.load(cmd["path"], mmap=True, weights_only=True)
        else:
            sd = torch.load(cmd["path"], weights_only=True)
        listing = [(name, tuple(t.shape)) for name, t in sd.items()]
        elapsed = time.perf_counter() - t0
        count = len(listing)
        del sd, listing
        gc.collect()
        return {"seconds": elapsed, "count": count}
    raise ValueError(f"unknown op {op!r}")


def main() -> None:
    print(json.dumps({"ready": True, "torch": torch.__version__, "import_s": IMPORT_S}), flush=True)
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd.get("op") == "quit":
            break
        try:
            out = {"ok": True, **handle(cmd)}
        except Exception as exc:  # reported to the benchmark, which fails loudly
            out = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
