"""A minimal CRI v1 RuntimeService client (gRPC over a unix socket).

The proto (``cri.proto`` here, flock's own subset of k8s.io/cri-api with the
upstream field numbers) is compiled with grpcio-tools on first use into a
temporary directory, so no generated code is committed and the subset is the
one source.  grpcio and grpcio-tools are test dependencies.  Calls are
blocking; Trio code runs them with ``trio.to_thread.run_sync``.
"""

from __future__ import annotations

import importlib
import shutil
import sys
import tempfile
import threading
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import attrs

PROTO = Path(__file__).with_name("cri.proto")
_MODULE = "flock_cri_v1"
_compiled: tuple[ModuleType, ModuleType] | None = None
_lock = threading.Lock()


def cri_modules() -> tuple[ModuleType, ModuleType]:
    """(messages, services) generated from cri.proto, compiled once per process."""
    global _compiled
    with _lock:
        if _compiled is not None:
            return _compiled
        try:
            from grpc_tools import protoc  # type: ignore[import-untyped]
        except ImportError as exc:
            raise RuntimeError("grpcio-tools is missing: pip install -e '.[test]' (scripts/bootstrap does)") from exc
        out = Path(tempfile.mkdtemp(prefix="flock-cri-"))
        try:
            shutil.copy(PROTO, out / f"{_MODULE}.proto")
            include = str(Path(protoc.__file__).parent / "_proto")
            code = protoc.main(
                [
                    "protoc",
                    f"-I{out}",
                    f"-I{include}",
                    f"--python_out={out}",
                    f"--grpc_python_out={out}",
                    f"{_MODULE}.proto",
                ]
            )
            if code != 0:
                raise RuntimeError(f"protoc failed ({code}) on {PROTO}")
            sys.path.insert(0, str(out))
            try:
                pb2 = importlib.import_module(f"{_MODULE}_pb2")
                grpc_pb2 = importlib.import_module(f"{_MODULE}_pb2_grpc")
            finally:
                sys.path.remove(str(out))
        finally:
            shutil.rmtree(out, ignore_errors=True)
        _compiled = (pb2, grpc_pb2)
        return _compiled


@attrs.frozen
class CriPortMapping:
    """A sandbox's ``PortMapping`` (a container's hostPort as the kubelet passes it): *protocol* is
    ``tcp``, ``udp`` or ``sctp`` (CRI's Protocol enum); *host_ip* "" for every address of the node."""

    container_port: int
    host_port: int
    protocol: str = "tcp"
    host_ip: str = ""


@attrs.frozen
class SandboxStatus:
    id: str
    ready: bool
    ips: tuple[str, ...]  # the primary IP first, as the runtime reports them
    info: dict[str, str]


@attrs.define(eq=False)
class CriClient:
    """The RuntimeService at ``unix://<socket>``; ``timeout`` bounds each call."""

    socket: Path
    timeout: float = 60.0
    _channel: Any = attrs.field(init=False, default=None)
    _stub: Any = attrs.field(init=False, default=None)

    def __attrs_post_init__(self) -> None:
        import grpc  # type: ignore[import-untyped]

        _, services = cri_modules()
        self._channel = grpc.insecure_channel(f"unix://{self.socket}")
        self._stub = services.RuntimeServiceStub(self._channel)

    @property
    def messages(self) -> ModuleType:
        return cri_modules()[0]

    def close(self) -> None:
        self._channel.close()

    def version(self) -> tuple[str, str, str]:
        """(runtime name, runtime version, runtime API version)."""
        reply = self._stub.Version(self.messages.VersionRequest(version="v1"), timeout=self.timeout)
        return reply.runtime_name, reply.runtime_version, reply.runtime_api_version

    def run_pod_sandbox(
        self,
        name: str,
        namespace: str,
        uid: str,
        *,
        attempt: int = 0,
        port_mappings: Sequence[CriPortMapping] = (),
        log_directory: str = "",
    ) -> str:
        m = self.messages
        ports = [
            m.PortMapping(
                protocol=m.Protocol.Value(p.protocol.upper()),
                container_port=p.container_port,
                host_port=p.host_port,
                host_ip=p.host_ip,
            )
            for p in port_mappings
        ]
        config = m.PodSandboxConfig(
            metadata=m.PodSandboxMetadata(name=name, namespace=namespace, uid=uid, attempt=attempt),
            hostname=name[:63],
            log_directory=log_directory,
            port_mappings=ports,
            labels={"io.kubernetes.pod.name": name, "io.kubernetes.pod.namespace": namespace},
        )
        reply = self._stub.RunPodSandbox(m.RunPodSandboxRequest(config=config), timeout=self.timeout)
        return reply.pod_sandbox_id

    def pod_sandbox_status(self, sandbox_id: str, *, verbose: bool = False) -> SandboxStatus:
        m = self.messages
        reply = self._stub.PodSandboxStatus(
            m.PodSandboxStatusRequest(pod_sandbox_id=sandbox_id, verbose=verbose), timeout=self.timeout
        )
        status = reply.status
        ips = tuple(ip for ip in (status.network.ip, *(a.ip for a in status.network.additional_ips)) if ip)
        return SandboxStatus(status.id, status.state == m.SANDBOX_READY, ips, dict(reply.info))

    def list_pod_sandboxes(self) -> list[str]:
        """The IDs of every sandbox the runtime knows, ready or not."""
        reply = self._stub.ListPodSandbox(self.messages.ListPodSandboxRequest(), timeout=self.timeout)
        return [item.id for item in reply.items]

    def stop_pod_sandbox(self, sandbox_id: str) -> None:
        self._stub.StopPodSandbox(self.messages.StopPodSandboxRequest(pod_sandbox_id=sandbox_id), timeout=self.timeout)

    def remove_pod_sandbox(self, sandbox_id: str) -> None:
        self._stub.RemovePodSandbox(
            self.messages.RemovePodSandboxRequest(pod_sandbox_id=sandbox_id), timeout=self.timeout
        )
