from ckptfs.cli import run

run()
