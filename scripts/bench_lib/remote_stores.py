"""The S3 servers the remote section reads from: the tests' own nginx and radosgw (``tests/remote_servers.py``),
each wrapped with what the section needs (publish a file as ``bkt/KEY``, count GETs, mount arguments, credentials).

* ``nginx``: a path-style, read-only S3 stand-in (it ignores signatures); its access log counts requests.
* ``nginx-capped``: the same, each answer capped at 40 MB/s (``limit_rate 40m``), as object stores cap each
  connection (S3: ~50-100 MB/s).
* ``radosgw``: Ceph's production S3 gateway on a one-node in-memory cluster, checking SigV4 signatures; it has no
  access log here, so its request counts are not shown (they are ckptfs's, the same as against nginx).
"""
from __future__ import annotations

import os
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))

from remote_servers import RADOSGW_PROGRAMS, Nginx, Radosgw, stop  # noqa: E402

BUCKET = "bkt"
DUMMY_CREDENTIALS = {"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench", "AWS_REGION": "us-east-1"}
RADOSGW_MEMORY = 3 << 30
"""The in-memory OSD's bytes: the 1 GiB checkpoint, the 20,000-tensor one and Ceph's own objects."""


class NginxStore:
    name = "nginx"
    limit_rate: str | None = None

    def __init__(self, base: Path) -> None:
        fresh(base)
        self.server = Nginx(base, limit_rate=self.limit_rate)
        (self.server.root / BUCKET).mkdir()
        self.url = self.server.url
        self.mount_args = ["--endpoint-url", self.url, "--anonymous"]
        self.env = dict(DUMMY_CREDENTIALS)
        self.signed = False

    def publish(self, path: Path, key: str) -> None:
        target = self.server.root / BUCKET / key
        try:
            os.link(path, target)
        except OSError:
            shutil.copyfile(path, target)

    def mark(self) -> int | None:
        return self.server.mark()

    def gets_since(self, mark: int | None, at_least: int) -> int | None:
        """GETs logged since ``mark``, once the log stops growing (nginx logs a request after answering it)."""
        assert mark is not None
        found = self.server.since(mark, at_least)
        while True:
            time.sleep(0.2)
            again = self.server.since(mark)
            if len(again) == len(found):
                return sum(r.method == "GET" for r in found)
            found = again

    def bare_target(self, key: str) -> str:
        return f"/{BUCKET}/{key}"

    def close(self) -> None:
        stop(self.server.process)


class CappedNginxStore(NginxStore):
    name = "nginx-capped"
    limit_rate = "40m"


class RadosgwStore:
    name = "radosgw"

    def __init__(self, base: Path) -> None:
        fresh(base)
        self.server = Radosgw(base, memory=RADOSGW_MEMORY)
        self.server.client.create_bucket(Bucket=BUCKET)
        self.url = self.server.url
        self.mount_args = ["--endpoint-url", self.url]
        self.env = dict(self.server.env)
        self.signed = True

    def publish(self, path: Path, key: str) -> None:
        self.server.client.upload_file(str(path), BUCKET, key)

    def mark(self) -> int | None:
        return None

    def gets_since(self, mark: int | None, at_least: int) -> int | None:
        return None

    def bare_target(self, key: str) -> str:
        """A presigned request target: a bare GET needs no signing of its own (Range is not a signed header)."""
        url = self.server.client.generate_presigned_url("get_object", Params={"Bucket": BUCKET, "Key": key},
                                                        ExpiresIn=6 * 3600)
        return url[len(self.url):]

    def close(self) -> None:
        self.server.close()


def fresh(base: Path) -> None:
    """An empty ``base`` (a kept work directory holds the last run's server files)."""
    shutil.rmtree(base, ignore_errors=True)
    base.mkdir(parents=True)


def missing_radosgw() -> list[str]:
    return [name for name in RADOSGW_PROGRAMS if shutil.which(name) is None]
