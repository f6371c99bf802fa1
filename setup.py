"""The compiled scanner (``ckptfs/pickle/_cscan*.c``), an optional extension: plain C with no Python.h, loaded
with ctypes. Without a C compiler the build skips it and ckptfs runs its pure-Python interpreter
(``ckptfs --version`` says which)."""

from setuptools import Extension, setup

setup(ext_modules=[Extension("ckptfs.pickle._cscan", ["ckptfs/pickle/_cscan.c", "ckptfs/pickle/_cscan_zip.c",
                                                        "ckptfs/pickle/_cscan_dcp.c"],
                             depends=["ckptfs/pickle/_cscan.h"], extra_compile_args=["-O2", "-std=c11"],
                             optional=True)])
