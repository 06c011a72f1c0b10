"""The document-store contract on Azure (Azurite) and S3 (moto's server)."""

from __future__ import annotations

import pytest

from outbox.testing.contracts.document_store import DocumentStoreContract
from tests.objectstore.conftest import Remote


class TestObjectStore(DocumentStoreContract):
    @pytest.fixture(autouse=True)
    def _remote(self, remote: Remote) -> None:
        self.remote = remote

    def table_uri(self) -> str:
        return self.remote.uri()

    def storage_options(self) -> dict[str, str]:
        return self.remote.storage_options
