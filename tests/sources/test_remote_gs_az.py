"""gs:// and az:// through fsspec (gcsfs, adlfs) against fake-gcs-server and Azurite on 127.0.0.1: files and DCP
prefixes read as torch wrote them, ``ls``/``info --json`` equal to the local file's, credentials shown nowhere."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from dcp_writers import simulate_ranks
from object_emulators import AZURITE_KEY, Emulator, azurite, fake_gcs, store  # noqa: F401  (fixtures)

import ckptfs
from ckptfs.errors import NoSuchObjectError
from ckptfs.sources import FsspecSource, PrefixSet, RemoteOptions

CLI = [sys.executable, "-m", "ckptfs.cli"]


def state_dict() -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(14)
    return {"embed.weight": torch.randn(200, 16, generator=generator),
            "norm": torch.randn(16, generator=generator).to(torch.bfloat16), "step": torch.tensor(3)}


def remote(emulator: Emulator) -> RemoteOptions:
    return RemoteOptions(storage_options=emulator.options)


def cli(emulator: Emulator, *args: str) -> subprocess.CompletedProcess[str]:
    options = [part for key, value in emulator.options.items() for part in ("--storage-option", f"{key}={value}")]
    return subprocess.run([*CLI, *args, *options], capture_output=True, text=True, timeout=120, check=False)


def test_a_checkpoint_reads_as_torch_wrote_it(store: Emulator, tmp_path: Path) -> None:  # noqa: F811
    tensors = state_dict()
    torch.save(tensors, tmp_path / "model.pt")
    store.fs.pipe("ckpts/run/model.pt", (tmp_path / "model.pt").read_bytes())
    url = f"{store.scheme}://ckpts/run/model.pt"
    with ckptfs.open(url, remote=remote(store)) as ck:
        assert isinstance(ck.source, FsspecSource) and ck.path == url
        assert {t.path[0]: ck.read(t) for t in ck} == \
            {k: v.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes() for k, v in tensors.items()}
        assert ck.source.stat().size == (tmp_path / "model.pt").stat().st_size
        assert ck.source.stat().mtime_ns > 0
    for command in ("ls", "info"):
        ours, theirs = cli(store, command, url, "--json"), cli(store, command, str(tmp_path / "model.pt"), "--json")
        assert ours.returncode == 0 and ours.stderr == "", ours.stderr
        if command == "ls":
            assert ours.stdout == theirs.stdout
        else:
            assert json.loads(ours.stdout) == {**json.loads(theirs.stdout), "file": url}
    with pytest.raises(NoSuchObjectError, match=rf"^{store.scheme}://ckpts/run/missing\.pt: no such object$"):
        ckptfs.open(f"{store.scheme}://ckpts/run/missing.pt", remote=remote(store))
    missing = cli(store, "ls", f"{store.scheme}://ckpts/run/missing.pt")
    assert missing.returncode != 0 and missing.stderr.count("\n") == 1, missing.stderr


def test_a_dcp_prefix(store: Emulator, tmp_path: Path) -> None:  # noqa: F811
    torch.manual_seed(0)
    state = {"model": {"w": torch.randn(9, 6), "b": torch.arange(5)}, "step": 7}
    simulate_ranks(state, {"model.w": (0, 3)}, tmp_path / "step7", world=3)
    for file in (tmp_path / "step7").iterdir():
        store.fs.pipe(f"ckpts/dcp/step7/{file.name}", file.read_bytes())
    with ckptfs.open(tmp_path / "step7") as ck:
        expected = {t.path: ck.read(t) for t in ck}
    for url in (f"{store.scheme}://ckpts/dcp/step7/", f"{store.scheme}://ckpts/dcp/step7"):
        with ckptfs.open(url, remote=remote(store)) as ck:
            assert isinstance(ck.source, PrefixSet) and ck.format == "dcp"
            assert {t.path: ck.read(t) for t in ck} == expected


def test_credentials_are_shown_nowhere(azurite: Emulator, tmp_path: Path) -> None:  # noqa: F811
    if not azurite.fs.exists("ckpts"):
        azurite.fs.mkdir("ckpts")
    torch.save(state_dict(), tmp_path / "model.pt")
    azurite.fs.pipe("ckpts/keys/model.pt", (tmp_path / "model.pt").read_bytes())
    connection = azurite.env["AZURE_STORAGE_CONNECTION_STRING"]
    env = {k: v for k, v in os.environ.items() if k != "AZURE_STORAGE_CONNECTION_STRING"}
    given = ["--storage-option", f"connection_string={connection}"]
    for url in ("az://ckpts/keys/model.pt", "az://ckpts/keys/missing.pt", "abfs://ckpts/nothing/"):
        for command in ("ls", "info"):
            result = subprocess.run([*CLI, command, url, "--json", *given], capture_output=True, text=True,
                                    timeout=120, env=env, check=False)
            assert AZURITE_KEY not in result.stdout + result.stderr
            assert "AccountKey" not in result.stdout + result.stderr
    with ckptfs.open("az://ckpts/keys/model.pt",
                     remote=RemoteOptions(storage_options={"connection_string": connection})) as ck:
        assert ck.path == "az://ckpts/keys/model.pt" and AZURITE_KEY not in repr(ck)
        buffer = io.StringIO()
        json.dump(ck.details, buffer)
        assert AZURITE_KEY not in buffer.getvalue()
