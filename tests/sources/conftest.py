from remote_servers import fault_proxy, moto_s3, nginx, radosgw, s3_env  # noqa: F401  (fixtures)
