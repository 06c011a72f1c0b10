"""The object-store fixtures (Azurite) for the erasure proof on blob storage."""

from tests.objectstore.conftest import azure_remote, azurite_server

__all__ = ["azure_remote", "azurite_server"]
