from ckptfs.cli.main import run

run()
