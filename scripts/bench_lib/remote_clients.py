"""HTTP clients side by side on one server: median 4 KiB ranged GET, one 256 MiB GET, 8 parallel 32 MiB GETs.

How ckptfs' remote sources chose their client (docs/remote.md). Serve a directory holding
big.bin (256 MiB) and bkt/big.bin (the same, for the S3 clients, path-style) with nginx on 127.0.0.1:18080,
install the clients (pip install obstore s3fs fsspec aiohttp urllib3), then:

    python scripts/bench_lib/remote_clients.py httpclient urllib3_ obstore_http obstore_s3 fsspec_http s3fs_
"""
import concurrent.futures as cf
import http.client
import random
import statistics
import sys
import time

HOST, PORT, PATH, SIZE = "127.0.0.1", 18080, "/big.bin", 256 << 20
URL = f"http://{HOST}:{PORT}{PATH}"
rng = random.Random(1)
OFFS = [rng.randrange(0, SIZE - 4096) for _ in range(300)]

def lat(get):
    get(0, 4096)
    ts = []
    for o in OFFS:
        t = time.perf_counter(); b = get(o, 4096); ts.append(time.perf_counter() - t)
        assert len(b) == 4096
    ts.sort()
    return f"4KiB GET median {statistics.median(ts)*1e6:.0f} us, p90 {ts[int(.9*len(ts))]*1e6:.0f} us"

def thr(get, par=None):
    best1 = bestp = 0
    for _ in range(3):
        t = time.perf_counter(); b = get(0, SIZE); dt = time.perf_counter() - t
        assert len(b) == SIZE; best1 = max(best1, SIZE / dt / 2**20)
        if par:
            t = time.perf_counter(); n = par(); dt = time.perf_counter() - t
            assert n == SIZE; bestp = max(bestp, SIZE / dt / 2**20)
    return f"256MiB 1 GET {best1:.0f} MiB/s" + (f", 8x32MiB parallel {bestp:.0f} MiB/s" if par else "")

def httpclient():
    import threading
    local = threading.local()
    def get(o, n):
        c = getattr(local, "c", None)
        if c is None:
            c = local.c = http.client.HTTPConnection(HOST, PORT)
        c.request("GET", PATH, headers={"Range": f"bytes={o}-{o+n-1}"})
        r = c.getresponse(); assert r.status == 206
        buf = bytearray(n); view = memoryview(buf); got = 0
        while got < n:
            k = r.readinto(view[got:]); got += k
            if not k: raise IOError
        return buf
    pool = cf.ThreadPoolExecutor(8)
    par = lambda: sum(len(b) for b in pool.map(lambda i: get(i*(32<<20), 32<<20), range(8)))
    return get, par

def urllib3_():
    import urllib3
    pm = urllib3.PoolManager(maxsize=8)
    def get(o, n):
        r = pm.request("GET", URL, headers={"Range": f"bytes={o}-{o+n-1}"}, preload_content=False)
        assert r.status == 206
        buf = bytearray(n); got = 0; view = memoryview(buf)
        while got < n:
            k = r.readinto(view[got:]); got += k
            if not k: raise IOError
        r.release_conn()
        return buf
    pool = cf.ThreadPoolExecutor(8)
    par = lambda: sum(len(b) for b in pool.map(lambda i: get(i*(32<<20), 32<<20), range(8)))
    return get, par

def obstore_http():
    import obstore
    from obstore.store import HTTPStore
    s = HTTPStore.from_url(f"http://{HOST}:{PORT}/", client_options={"allow_http": True})
    get = lambda o, n: obstore.get_range(s, "big.bin", start=o, end=o+n)
    par = lambda: sum(len(b) for b in obstore.get_ranges(s, "big.bin", starts=[i*(32<<20) for i in range(8)], lengths=[32<<20]*8))
    return get, par

def obstore_s3():
    import obstore
    from obstore.store import S3Store
    s = S3Store("bkt", endpoint=f"http://{HOST}:{PORT}", skip_signature=True, virtual_hosted_style_request=False,
                region="us-east-1", client_options={"allow_http": True})
    get = lambda o, n: obstore.get_range(s, "big.bin", start=o, end=o+n)
    par = lambda: sum(len(b) for b in obstore.get_ranges(s, "big.bin", starts=[i*(32<<20) for i in range(8)], lengths=[32<<20]*8))
    return get, par

def fsspec_http():
    import fsspec
    fs = fsspec.filesystem("http")
    get = lambda o, n: fs.cat_file(URL, start=o, end=o+n)
    par = lambda: sum(len(b) for b in fs.cat_ranges([URL]*8, [i*(32<<20) for i in range(8)], [(i+1)*(32<<20) for i in range(8)]))
    return get, par

def s3fs_():
    import s3fs
    fs = s3fs.S3FileSystem(anon=True, endpoint_url=f"http://{HOST}:{PORT}")
    get = lambda o, n: fs.cat_file("bkt/big.bin", start=o, end=o+n)
    par = lambda: sum(len(b) for b in fs.cat_ranges(["bkt/big.bin"]*8, [i*(32<<20) for i in range(8)], [(i+1)*(32<<20) for i in range(8)]))
    return get, par

for name in sys.argv[1:]:
    get, par = globals()[name]()
    print(f"{name:13s} {lat(get)}; {thr(get, par)}", flush=True)
