"""The FUSE adapter: libfuse3 bindings, the operations serving an ``fs.Layout``, mounting and unmounting."""
