"""The object-store fixtures (Azurite, the S3 server) for the erasure proof."""

from tests.objectstore.conftest import azurite_server, remote, s3_server

__all__ = ["azurite_server", "remote", "s3_server"]
