"""The document-store contract on a local disk (tests/objectstore runs it on Azure and S3)."""

from __future__ import annotations

from pathlib import Path

import pytest

from outbox.testing.contracts.document_store import DocumentStoreContract


class TestLocalDisk(DocumentStoreContract):
    @pytest.fixture(autouse=True)
    def _where(self, tmp_path: Path) -> None:
        self.where = tmp_path

    def table_uri(self) -> str:
        return str(self.where / "documents")
