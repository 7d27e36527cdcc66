"""Where the API server is and how to authenticate: in-cluster or a kubeconfig.

Each call builds its own ``Configuration`` and never touches the library's
global default, so several clients (tests, the lab) can coexist.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Mapping
from pathlib import Path

from kubernetes_asyncio.client import Configuration
from kubernetes_asyncio.config import load_kube_config

log = logging.getLogger("flock.watchers")

SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
# Projected service-account tokens rotate; re-read the file this often.
TOKEN_REREAD_SECONDS = 60.0


class ClientConfigError(Exception):
    """No usable API server configuration; names what is missing."""


def in_cluster_configuration(
    environ: Mapping[str, str] = os.environ,
    account_dir: Path = SERVICE_ACCOUNT_DIR,
    token_reread_seconds: float = TOKEN_REREAD_SECONDS,
) -> Configuration:
    """Configuration from the pod's service account (KUBERNETES_SERVICE_HOST/PORT,
    token, ca.crt).  The token's trailing newline is stripped (the library's own
    loader sends it along in the header) and the token is re-read every minute."""
    host, port = environ.get("KUBERNETES_SERVICE_HOST", ""), environ.get("KUBERNETES_SERVICE_PORT", "")
    if not host or not port:
        raise ClientConfigError(
            f"not in a cluster: KUBERNETES_SERVICE_HOST={host!r} KUBERNETES_SERVICE_PORT={port!r}; pass --kubeconfig"
        )
    token_file, ca_file = account_dir / "token", account_dir / "ca.crt"

    def read_token() -> str:
        try:
            token = token_file.read_text().strip()
        except OSError as exc:
            raise ClientConfigError(f"service account token {token_file}: {exc.strerror}") from None
        if not token:
            raise ClientConfigError(f"service account token {token_file} is empty")
        return "Bearer " + token

    if not ca_file.is_file():
        raise ClientConfigError(f"service account CA {ca_file} does not exist")
    conf = Configuration()
    conf.host = "https://" + (f"[{host}]:{port}" if ":" in host else f"{host}:{port}")
    conf.ssl_ca_cert = str(ca_file)
    conf.api_key["BearerToken"] = read_token()
    reread_at = [time.monotonic() + token_reread_seconds]

    def refresh(c: Configuration) -> None:
        # Called by the client before each request; a failed re-read keeps the old token.
        if time.monotonic() >= reread_at[0]:
            reread_at[0] = time.monotonic() + token_reread_seconds
            try:
                c.api_key["BearerToken"] = read_token()
            except ClientConfigError as exc:
                log.warning("keeping the previous service account token: %s", exc)

    conf.refresh_api_key_hook = refresh
    return conf


async def kubeconfig_configuration(path: str | os.PathLike[str]) -> Configuration:
    """Configuration from a kubeconfig file (an asyncio coroutine: call it through the bridge)."""
    if not await asyncio.to_thread(Path(path).is_file):
        raise ClientConfigError(f"kubeconfig {os.fspath(path)!r} does not exist")
    conf = Configuration()
    await load_kube_config(config_file=os.fspath(path), client_configuration=conf, persist_config=False)
    return conf
