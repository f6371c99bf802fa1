import pytest
from remote_servers import MotoS3, fault_proxy, moto_s3, nginx, radosgw  # noqa: F401  (fixtures)


@pytest.fixture
def s3_env(moto_s3: MotoS3, monkeypatch: pytest.MonkeyPatch) -> MotoS3:  # noqa: F811
    """moto's keys and endpoint in the environment, as the AWS chain finds them."""
    for name, value in moto_s3.env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", moto_s3.url)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    return moto_s3
