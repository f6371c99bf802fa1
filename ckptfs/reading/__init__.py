"""Where a tensor's bytes are and how they are read: extents of the source, storage reads, gathers."""
