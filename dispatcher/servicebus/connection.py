"""The Service Bus clients of the command queue and of ``outbox migrate``, from the environment.

Why apart: building the clients is the one step both the command queue (``from_settings``) and
provisioning (``admin``) take, and neither needs the other's code for it. Secrets stay in the
environment, never in ``Settings``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from dispatcher.servicebus import sdk
from outbox.core.errors import ConfigurationError, MissingDependencyError


def connect(env: Mapping[str, str] | None = None) -> tuple[Any, Any]:
    """(ServiceBusClient, ServiceBusAdministrationClient) from the environment, or from the
    factory ``sdk.use_clients`` installed."""
    factory = sdk.client_factory()
    if factory is not None:
        return factory()
    sb, _ = sdk.load()
    from azure.servicebus.management import ServiceBusAdministrationClient

    env = os.environ if env is None else env
    conn = env.get(sdk.ENV_CONNECTION_STRING, "").strip()
    if conn:
        try:
            return (
                sb.ServiceBusClient.from_connection_string(conn),
                ServiceBusAdministrationClient.from_connection_string(conn),
            )
        except (ValueError, TypeError) as e:  # never echo the string: it holds a key
            raise ConfigurationError(
                f"{sdk.ENV_CONNECTION_STRING} is not a valid Service Bus connection string "
                f"({type(e).__name__})"
            ) from e
    namespace = env.get(sdk.ENV_NAMESPACE, "").strip()
    if namespace:
        try:
            from azure.identity import DefaultAzureCredential
        except ImportError as e:
            raise MissingDependencyError(
                f"{sdk.ENV_NAMESPACE} is set, which needs azure-identity for the credential",
                hint=f"pip install azure-identity, or set {sdk.ENV_CONNECTION_STRING} instead",
            ) from e
        credential = DefaultAzureCredential()
        return (
            sb.ServiceBusClient(namespace, credential),
            ServiceBusAdministrationClient(namespace, credential),
        )
    raise ConfigurationError(
        f"Service Bus (command_transport or transport 'servicebus') needs "
        f"{sdk.ENV_CONNECTION_STRING} (or {sdk.ENV_NAMESPACE} with azure-identity installed)",
        hint="or set command_transport = 'sql' and a transport other than servicebus",
    )
