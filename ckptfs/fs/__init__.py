"""The file system a checkpoint becomes, without FUSE: names, nodes, generated files, and every file as pieces."""
