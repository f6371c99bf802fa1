"""DCP directories on object storage mounted for real (http:// on nginx, s3:// on moto): the tree, bytes, index and
``ls``/``info --json`` of the same directory mounted from disk, but for its name."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
from dcp_writers import raw_bytes, simulate_ranks, simulate_ranks_without_collectives
from remote_servers import MotoS3, Nginx, moto_s3, nginx  # noqa: F401  (fixtures)

from mount.helpers import Mounter, run_cli, tensor_file

pytestmark = pytest.mark.mount
CUTS = {"model.big": (1, 3), "model.rows": (0, 3)}


@pytest.fixture(scope="module")
def sharded(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    torch.manual_seed(0)
    state = {"model": {"big": torch.randn(600, 500), "rows": torch.arange(90, dtype=torch.int64).reshape(9, 10)},
             "meta": {"epoch": 3}}
    base = tmp_path_factory.mktemp("remote_dcp")
    simulate_ranks(state, CUTS, base / "step10", world=3)
    simulate_ranks_without_collectives(state, CUTS, base / "ranks", world=3)
    return base, state


def tree(mnt: Path) -> dict[str, bytes]:
    """Every file's bytes but those naming the source (the index, the safetensors views' headers)."""
    return {str(p.relative_to(mnt)): p.read_bytes() for p in sorted(mnt.rglob("*"))
            if p.is_file() and p.name not in ("index.json", "model.safetensors")}


def cli_output(command: str, target: str) -> str:
    result = run_cli(command, target, "--json")
    assert result.returncode == 0 and result.stderr == "", result.stderr
    return result.stdout


def test_an_http_prefix_mounts_as_the_directory(nginx: Nginx, sharded: tuple[Path, dict],  # noqa: F811
                                                mounter: Mounter) -> None:
    base, state = sharded
    shutil.copytree(base / "step10", nginx.root / "ckpts" / "step10", dirs_exist_ok=True)
    url = f"{nginx.url}/ckpts/step10/"
    local = mounter(base / "step10")
    remote = mounter(url)  # type: ignore[arg-type]
    big = tensor_file(remote, ("model", "big"))
    assert subprocess.run(["cat", str(big)], capture_output=True, check=True).stdout == \
        raw_bytes(state["model"]["big"])
    assert tree(remote) == tree(local)
    index = json.loads((remote / ".ckptfs" / "index.json").read_text())
    assert index["source"] == url
    assert index == {**json.loads((local / ".ckptfs" / "index.json").read_text()), "source": url}
    assert os.stat(remote).st_mode & 0o777 == 0o555
    assert cli_output("ls", url) == cli_output("ls", str(base / "step10"))
    info = json.loads(cli_output("info", url))
    assert info["file"] == url
    assert info == {**json.loads(cli_output("info", str(base / "step10"))), "file": url}


def test_s3_prefixes_mount_with_and_without_collectives(moto_s3: MotoS3, sharded: tuple[Path, dict],  # noqa: F811
                                                        mounter: Mounter, monkeypatch: pytest.MonkeyPatch) -> None:
    base, state = sharded
    moto_s3.client.create_bucket(Bucket="dcp-mounts")
    for name in ("step10", "ranks"):
        for file in (base / name).iterdir():
            moto_s3.client.put_object(Bucket="dcp-mounts", Key=f"run/{name}/{file.name}", Body=file.read_bytes())
    for name, value in moto_s3.env.items():
        monkeypatch.setenv(name, value)
    for name in ("step10", "ranks"):
        local = mounter(base / name)
        remote = mounter(f"s3://dcp-mounts/run/{name}", "--endpoint-url", moto_s3.url)  # type: ignore[arg-type]
        assert tree(remote) == tree(local)
        assert tensor_file(remote, ("model", "rows")).read_bytes() == raw_bytes(state["model"]["rows"])
        index = json.loads((remote / ".ckptfs" / "index.json").read_text())
        assert index["source"] == f"s3://dcp-mounts/run/{name}/"
        assert moto_s3.env["AWS_SECRET_ACCESS_KEY"] not in json.dumps(index)
