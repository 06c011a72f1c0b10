"""Errors from an object store, told in one line: what is wrong, which setting, and the fix.

Why: deltalake passes object_store's error chain up whole (5 to 11 lines of Rust error text,
with a request to the cloud's metadata endpoint when no credentials are configured), which names
neither our setting nor a fix (issue 32). The patterns below are the ones measured against
Azurite and moto's S3 server (tests/objectstore/test_bad_input.py runs each through the CLI);
anything else keeps its first line. The text never includes a storage option's value: only
deltalake's message (which holds no secret) is matched, and only our own words are printed.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from outbox.core.errors import ConfigurationError, StoreError, TableNotFoundError


@dataclass(frozen=True, slots=True)
class _Cause:
    pattern: re.Pattern[str]
    what: str  # "{where}" is the container or bucket, as the URI names it
    hint: str
    error: type[StoreError] | type[ConfigurationError] = ConfigurationError


def _p(*alternatives: str) -> re.Pattern[str]:
    return re.compile("|".join(alternatives), re.IGNORECASE)


def scheme(uri: str) -> str:
    """``azure``, ``s3``, ``gcs`` or ``local``."""
    head = uri.split("://", 1)[0].lower() if "://" in uri else "file"
    if head in ("az", "abfs", "abfss", "adl", "azure", "wasb", "wasbs"):
        return "azure"
    if head in ("s3", "s3a"):
        return "s3"
    if head in ("gs", "gcs"):
        return "gcs"
    return "local"


def where(uri: str) -> str:
    """The container or bucket a URI names (``abfss://c@account...`` gives ``c``)."""
    rest = uri.split("://", 1)[-1]
    return rest.split("/", 1)[0].split("@", 1)[0]


_AZURE_KEYS = (
    "the account key (azure_storage_account_key, or AZURE_STORAGE_ACCOUNT_KEY), a SAS "
    "(azure_storage_sas_key), a service principal (azure_client_id, azure_client_secret, "
    'azure_tenant_id), or azure_use_azure_cli = "true"'
)
_S3_KEYS = (
    "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (in [storage_options] or the environment), a "
    "profile (AWS_PROFILE), or the machine's role"
)

_CAUSES: dict[str, tuple[_Cause, ...]] = {
    "azure": (
        # first: a refused scheme is the whole story, whatever else the message holds
        _Cause(
            _p(r"URL scheme is not allowed"),
            "the endpoint is plain http, which the client refuses by default",
            'set allow_http = "true" in [storage_options] (only for a local emulator), or use '
            "https",
        ),
        _Cause(  # next: without credentials the client asks the metadata endpoint, which may 403
            _p(
                r"token request",
                r"169\.254\.169\.254",
                r"managed identity",
                r"no credential",
                r"missing.*(credential|account)",
                r"account.*(must|is required)",
            ),
            "no credentials for the storage account",
            "set " + _AZURE_KEYS,
        ),
        _Cause(
            _p(r"ContainerNotFound", r"container does not exist"),
            "the container {where!r} does not exist",
            "create it (az storage container create --name {where}), or fix table_uri",
        ),
        _Cause(
            _p(
                r"AuthenticationFailed",
                r"failed to authenticate",
                r"AuthorizationFailure",
                r"signature.*(did not match|mismatch)",
                r"lacked the necessary privileges",
                r"\b403\b",
            ),
            "the storage account refused the credentials",
            "check " + _AZURE_KEYS,
        ),
    ),
    "s3": (
        _Cause(
            _p(r"URL scheme is not allowed"),
            "the endpoint is plain http, which the client refuses by default",
            'set AWS_ALLOW_HTTP = "true" in [storage_options] (only for a local server), or use '
            "https",
        ),
        _Cause(  # next: without credentials the SDK asks the metadata endpoint, which may 403
            _p(
                r"169\.254\.169\.254",
                r"instance metadata",
                r"\bIMDS\b",
                r"failed to load credentials",
                r"no credential",
            ),
            "no credentials for S3",
            "set " + _S3_KEYS,
        ),
        _Cause(
            _p(r"NoSuchBucket", r"bucket does not exist"),
            "the bucket {where!r} does not exist",
            "create it (aws s3 mb s3://{where}), or fix table_uri",
        ),
        _Cause(
            _p(
                r"InvalidAccessKeyId",
                r"SignatureDoesNotMatch",
                r"AccessDenied",
                r"InvalidToken",
                r"lacked the necessary privileges",
                r"\b403\b",
            ),
            "S3 refused the credentials",
            "check " + _S3_KEYS,
        ),
    ),
}

_UNREACHABLE = _p(
    r"connection refused",
    r"tcp connect error",
    r"dns error",
    r"failed to lookup address",
    r"error sending request",
    r"timed out",
    r"connection reset",
)


def explain(uri: str, storage_options: Mapping[str, str], error: BaseException) -> BaseException:
    """``error`` (a deltalake or object_store failure on ``uri``) as one of ours, in one line;
    the original when it is not about reaching the store."""
    kind = scheme(uri)
    text = str(error)
    if kind == "local":
        return error
    for cause in _CAUSES.get(kind, ()):
        if cause.pattern.search(text):
            what = cause.what.format(where=where(uri))
            hint = cause.hint.format(where=where(uri))
            return cause.error(f"cannot reach the Delta table at {uri}: {what}", hint=hint)
    if _UNREACHABLE.search(text):
        endpoint = _endpoint(kind, storage_options)
        return StoreError(
            f"cannot reach the Delta table at {uri}: the store did not answer"
            + (f" at {endpoint}" if endpoint else ""),
            hint="check the endpoint ("
            + (
                "AWS_ENDPOINT_URL"
                if kind == "s3"
                else "azure_storage_endpoint / AZURITE_BLOB_STORAGE_URL"
            )
            + ") and the network; retried by the next run",
        )
    if isinstance(error, TableNotFoundError):
        return error
    return error


def _endpoint(kind: str, options: Mapping[str, str]) -> str:
    """The endpoint a user configured (an address: never a secret)."""
    keys = (
        ("AWS_ENDPOINT_URL", "aws_endpoint_url", "AWS_ENDPOINT", "aws_endpoint", "endpoint")
        if kind == "s3"
        else ("azure_storage_endpoint", "AZURE_STORAGE_ENDPOINT", "endpoint")
    )
    for k in keys:
        if options.get(k):
            return str(options[k])
    return ""
