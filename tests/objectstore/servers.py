"""Start the object-store servers the tests run against, on 127.0.0.1: Azurite (Azure Blob / ADLS
Gen2 emulator, npm) and moto's server (S3, PyPI).

Facts they rest on (measured here, issue 32): deltalake 1.6.6 talks to Azurite with
``storage_options={"azure_storage_use_emulator": "true"}`` plus ``AZURITE_BLOB_STORAGE_URL`` in
the process environment (an explicit endpoint without the emulator flag fails from version 1 on),
and containers must exist first. moto honours ``If-None-Match: *``, so deltalake's conditional-put
commits are safe on it.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path
from typing import Any

from tests.local_server import LocalServer

ROOT = Path(__file__).resolve().parents[2]
AZURITE_DIR = ROOT / ".cache" / "azurite"
#: Azurite's well-known development account.
ACCOUNT = "devstoreaccount1"
ACCOUNT_KEY = (
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
)
S3_KEY = "test"


def azurite_bin() -> Path | None:
    configured = os.environ.get("OUTBOX_TEST_AZURITE_DIR")
    path = (Path(configured) if configured else AZURITE_DIR) / "node_modules" / ".bin"
    binary = path / "azurite-blob"
    return binary if binary.exists() and shutil.which("node") else None


MOTO_MISSING = "the S3 test server is not installed; run scripts/setup.sh --dev (moto[server])"


def moto_bin() -> Path | None:
    binary = Path(sys.executable).parent / "moto_server"
    return binary if binary.exists() else None


class _Server(LocalServer):
    def __init__(self) -> None:
        super().__init__()
        self._made: set[str] = set()  # containers or buckets made by the *_once methods


class Azurite(_Server):
    name = "azurite"

    def __init__(self, binary: Path) -> None:
        super().__init__()
        self.binary = binary
        self.url = f"http://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        return [
            str(self.binary),
            "--blobHost",
            "127.0.0.1",
            "--blobPort",
            str(self.port),
            "--location",
            str(self.dir / "data"),
            "--skipApiVersionCheck",
            "--silent",
        ]

    def environment(self) -> dict[str, str]:
        """What a process needs to reach this server through deltalake (read at each call)."""
        return {"AZURITE_BLOB_STORAGE_URL": self.url}

    def storage_options(self) -> dict[str, str]:
        return {"azure_storage_use_emulator": "true"}

    def create_container_once(self, name: str) -> None:
        if name not in self._made:
            self.create_container(name)
            self._made.add(name)

    def create_container(self, name: str) -> None:
        from azure.storage.blob import BlobServiceClient

        conn = (
            f"DefaultEndpointsProtocol=http;AccountName={ACCOUNT};AccountKey={ACCOUNT_KEY};"
            f"BlobEndpoint={self.url}/{ACCOUNT};"
        )
        BlobServiceClient.from_connection_string(conn).create_container(name)


class MotoS3(_Server):
    """moto's S3 server. It accepts any key unless ``checks_keys``: then it checks signatures
    against its IAM users (none, so every key is refused: what a wrong key looks like)."""

    name = "moto"

    def __init__(self, binary: Path, *, checks_keys: bool = False) -> None:
        super().__init__()
        self.binary = binary
        self.url = f"http://127.0.0.1:{self.port}"
        self.checks_keys = checks_keys

    def server_environment(self) -> dict[str, str]:
        return {"INITIAL_NO_AUTH_ACTION_COUNT": "0"} if self.checks_keys else {}

    def command(self) -> list[str]:
        return [str(self.binary), "-H", "127.0.0.1", "-p", str(self.port)]

    def environment(self) -> dict[str, str]:
        return {}

    def storage_options(self) -> dict[str, str]:
        return {
            "AWS_ENDPOINT_URL": self.url,
            "AWS_ACCESS_KEY_ID": S3_KEY,
            "AWS_SECRET_ACCESS_KEY": S3_KEY,
            "AWS_REGION": "us-east-1",
            "AWS_ALLOW_HTTP": "true",
        }

    def create_bucket_once(self, name: str) -> None:
        if name not in self._made:
            self.create_bucket(name)
            self._made.add(name)

    def create_bucket(self, name: str) -> None:
        import boto3

        client: Any = boto3.client(
            "s3",
            endpoint_url=self.url,
            aws_access_key_id=S3_KEY,
            aws_secret_access_key=S3_KEY,
            region_name="us-east-1",
        )
        client.create_bucket(Bucket=name)
