from remote_servers import nginx  # noqa: F401  (fixture)
