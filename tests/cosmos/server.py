"""Start the local Cosmos DB-protocol server (``@vercel/cosmosdb-server``) for the tests.

``scripts/ensure-cosmos.sh`` installs it into ``.cache/cosmos/``; ``OUTBOX_TEST_COSMOS_DIR`` may
point at another install folder (the one holding ``node_modules``). It accepts any account key
and serves https with a self-signed certificate that azure-cosmos accepts for 127.0.0.1.

Why not its ``cosmosdb-server`` command: that answers every request with ``Connection: close``,
so each SDK request pays a new TLS handshake (0.7 s each on a loaded 2-core machine, which made
the racing-writers contract test take minutes). The same package's ``createHttpsServer`` with
``keepAlive: true`` is the identical server with connections reused.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from tests.local_server import LocalServer

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_DIR = ROOT / ".cache" / "cosmos"
PACKAGE = Path("node_modules") / "@vercel" / "cosmosdb-server"
_START = (
    "const [pkg, port] = process.argv.slice(1);"
    "require(pkg).createHttpsServer({keepAlive: true}).listen(Number(port), '127.0.0.1',"
    " () => console.log('ready'));"
)
#: Any base64 string is accepted by the local server.
KEY = "bG9jYWwtdGVzdC1rZXk="


def server_package() -> Path | None:
    """The installed package folder, or None (not installed, or no ``node``)."""
    configured = os.environ.get("OUTBOX_TEST_COSMOS_DIR")
    package = (Path(configured) if configured else DEFAULT_DIR) / PACKAGE
    return package if (package / "package.json").is_file() and shutil.which("node") else None


class CosmosServer(LocalServer):
    name = "cosmosdb-server"
    start_timeout = 30.0

    def __init__(self, package: Path) -> None:
        super().__init__()
        self.package = package
        self.endpoint = f"https://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        return ["node", "-e", _START, str(self.package), str(self.port)]
