"""ckptfs's remote reader alone, in process (no FUSE): the first sequential read of a byte range of an s3:// object
in the mount's request size (1 MiB, ``fuse.operations.MAX_REQUEST``), told the range is a storage as a mount
tells it. Prints the GB/s. Run by the remote section with the PYTHONPATH of the ckptfs it measures:

    python scripts/bench_lib/remote_reader.py s3://bkt/big.pt OFFSET LENGTH ENDPOINT_URL [--anonymous]
"""
from __future__ import annotations

import sys
import time

from ckptfs.sources import RemoteOptions, hint_extents, open_source

REQUEST = 1 << 20


def main() -> None:
    url, offset, length, endpoint = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    options = RemoteOptions(endpoint_url=endpoint, anonymous="--anonymous" in sys.argv[5:])
    source = open_source(url, options)
    try:
        hint_extents(source, [(offset, offset + length)])
        started = time.perf_counter()
        for at in range(offset, offset + length, REQUEST):
            got = len(source.read(at, min(REQUEST, offset + length - at)))
            if not got:
                raise SystemExit(f"nothing read at {at}")
        print(f"{length / 1e9 / (time.perf_counter() - started):.4f}")
    finally:
        source.close()


if __name__ == "__main__":
    main()
