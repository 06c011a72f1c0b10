#!/usr/bin/env bash
# Installs Azurite (the Azure Storage emulator, npm package azurite 3.37.0), which the object-store
# tests start on 127.0.0.1, into .cache/azurite/. Idempotent: a second run does nothing. Node.js
# and npm come from Debian's packages when missing. Prints the azurite-blob path; the tests find
# it there, or wherever OUTBOX_TEST_AZURITE_DIR points.
set -euo pipefail
exec "$(dirname "$0")/ensure-npm-package.sh" azurite azurite 3.37.0 azurite-blob
