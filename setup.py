"""The compiled scanner (``ckptfs/pickle/_cscan*.c``) and listing loop (``ckptfs/fuse/_cdirents.c``), optional
extensions: plain C with no Python.h, loaded with ctypes. Without a C compiler the build skips them and ckptfs runs
its pure-Python interpreter and loop (``ckptfs --version`` says which)."""

from setuptools import Extension, setup

SOURCES = ["_cscan.c", "_cscan_zip.c", "_cscan_dcp.c", "_cscan_dcp_objects.c", "_cscan_dcp_join.c"]
HEADERS = ["_cscan.h", "_cscan_dcp.h"]

setup(ext_modules=[Extension("ckptfs.pickle._cscan", [f"ckptfs/pickle/{name}" for name in SOURCES],
                             depends=[f"ckptfs/pickle/{name}" for name in HEADERS],
                             extra_compile_args=["-O2", "-std=c11"], optional=True),
                   Extension("ckptfs.fuse._cdirents", ["ckptfs/fuse/_cdirents.c"], extra_compile_args=["-O2", "-std=c11"],
                             optional=True)])
