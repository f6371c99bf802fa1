"""The checkpoint model: plain records of storages and tensors, dtypes, the rebuild handlers, the object tree."""
