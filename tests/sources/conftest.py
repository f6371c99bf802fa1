from remote_servers import fault_proxy, moto_s3, nginx, radosgw  # noqa: F401  (fixtures)
