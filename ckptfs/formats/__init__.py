"""Container formats: how each kind of checkpoint file lays out its pickles and storages."""
