"""gs:// and az:// mounted for real (fake-gcs-server, Azurite): the daemon forks after opening, and fsspec's
backends are made again in it; the tree and bytes are a local mount's, credentials in neither the index nor the
mount table."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from object_emulators import AZURITE_KEY, Emulator, azurite, fake_gcs, store  # noqa: F401  (fixtures)

from mount.helpers import Mounter

pytestmark = pytest.mark.mount


def tree(mnt: Path) -> dict[str, bytes]:
    return {str(p.relative_to(mnt)): p.read_bytes() for p in sorted(mnt.rglob("*"))
            if p.is_file() and p.name not in ("index.json", "model.safetensors")}


def test_a_mount_shows_the_tree_and_bytes_of_a_local_one(store: Emulator, mounter: Mounter,  # noqa: F811
                                                          tmp_path: Path) -> None:
    generator = torch.Generator().manual_seed(16)
    tensors = {"embed.weight": torch.randn(500, 64, generator=generator), "bias": torch.arange(64)}
    torch.save(tensors, tmp_path / "model.pt")
    store.fs.pipe("ckpts/mounted/model.pt", (tmp_path / "model.pt").read_bytes())
    url = f"{store.scheme}://ckpts/mounted/model.pt"
    options = [part for key, value in store.options.items() for part in ("--storage-option", f"{key}={value}")]
    local = mounter(tmp_path / "model.pt")
    remote = mounter(url, *options)  # type: ignore[arg-type]
    assert (remote / "embed.weight").read_bytes() == tensors["embed.weight"].numpy().tobytes()
    assert tree(remote) == tree(local)
    index = (remote / ".ckptfs" / "index.json").read_text()
    assert json.loads(index)["source"] == url
    mounts = Path("/proc/self/mountinfo").read_text()
    for secret in (AZURITE_KEY, "AccountKey"):
        assert secret not in index and secret not in mounts
