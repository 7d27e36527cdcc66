"""A large cluster as kube-apiserver serves it, generated deterministically: for scale benchmarks.

:class:`ScaleCluster` lays out a :class:`ClusterShape` (150,000 pods over
5,000 nodes in 2,000 namespaces with one NetworkPolicy each, by default) and
makes every object on demand, the same for the same seed::

    cluster = ScaleCluster(ClusterShape.preset("3k"))
    for obj in cluster.objects():        # Namespaces, NodeConfigs, NetworkPolicies, Pods
        ...
    churn = Churn(cluster)
    change = churn.next()                # a remote pod's next label, status or re-create

Pods look like a Deployment's, StatefulSet's or DaemonSet's replicas as the
API server returns them: uid, resourceVersion, labels and annotations, an
ownerReference, the kube-controller-manager's and the kubelet's managedFields
(fieldsV1 trees derived from the fields they own), 1–3 containers with env,
resources, named ports, probes and volume mounts, the projected
service-account volume, tolerations, and a Running status with podIPs and
containerStatuses.  Fields that admission adds (the token volume,
tolerations, priority) are in the object but not in the controller's
managedFields, as on a real cluster.  Each pod is padded with env entries up
to a drawn size of 4.2–6.0 KiB of compact JSON (what kube-apiserver sends);
one whose sidecars already take more stays as it is (up to about 8.5 KiB).
That is 5.6 KiB on average, nine pods in ten within 4–6 KiB
(:func:`average_pod_size`).  Replicas of one app share their template
(labels, images, env), as a ReplicaSet's do.  Objects share nested values
with each other: copy one before changing it.

Addresses are documentation or unique-local only: node *m*'s pods are in
``fd00:0:0:<m>::/64`` and the local node's (the one the agent under test runs
as) in ``2001:db8:0:1::/64``; pods are IPv6 only.  The local node's pods are
Pending without an address: the benchmark ADDs them through the CNI plugin
and writes their status (:meth:`ScaleCluster.running_status`) as a kubelet does.
"""

from __future__ import annotations

import bisect
import calendar
import ipaddress
import json
import random
import time
import uuid
from collections.abc import Iterator, Mapping
from typing import Any

import attrs

from flock.apiserver._resources import NAMESPACES, NETWORKPOLICIES, NODECONFIGS, PODS, Resource

Object = dict[str, Any]

LOCAL_CIDR6 = "2001:db8:0:1::/64"
MIN_POD_BYTES, MAX_POD_BYTES = 4300, 6144  # padding targets: 4.2–6.0 KiB of compact JSON
_SIZE_SKEW = 1.7  # target = MAX - (MAX - MIN) * u**SKEW: pods are 5.6 KiB on average
_EPOCH = calendar.timegm((2025, 3, 1, 8, 0, 0))
_RAND_CHARS = "bcdfghjklmnpqrstvwxz2456789"  # k8s.io/apimachinery's rand.String alphabet
_COMPACT = (",", ":")

_TEAMS = (
    "payments", "checkout", "catalog", "search", "identity", "messaging", "billing", "ledger", "growth",
    "media", "maps", "fraud", "support", "platform", "data", "ml", "ads", "notifications", "orders", "shipping",
    "inventory", "pricing", "reviews", "social", "partners",
)  # fmt: skip
_ENVS = ("prod", "staging", "dev", "qa")
_APPS = (
    "api", "web", "frontend", "backend", "worker", "scheduler", "gateway", "ingest", "etl", "reports",
    "recommender", "thumbnailer", "sessions", "profiles", "graphql", "admin", "webhooks", "sync", "mailer",
    "indexer", "exporter", "cache", "queue", "auth", "users", "orders", "carts", "search", "events", "feeds",
)  # fmt: skip
_STATEFUL = ("redis", "postgres", "kafka", "zookeeper", "elasticsearch", "rabbitmq")
_REPLICAS = (1, 1, 2, 2, 2, 3, 3, 3, 3, 4, 5, 6, 8, 10, 12)
_PORTS = (("http", 8080), ("grpc", 9000), ("http-api", 8000), ("web", 3000), ("http", 80))
_STATEFUL_PORTS = {
    "redis": ("tcp-redis", 6379),
    "postgres": ("tcp-postgresql", 5432),
    "kafka": ("tcp-kafka", 9092),
    "zookeeper": ("tcp-client", 2181),
    "elasticsearch": ("http", 9200),
    "rabbitmq": ("amqp", 5672),
}
_SIDECARS = (
    ("istio-proxy", "registry.example.com/istio/proxyv2:1.22.3", ("http-envoy-prom", 15090)),
    ("log-shipper", "registry.example.com/fluent/fluent-bit:3.0.7", ("http-fb", 2020)),
    ("cloud-sql-proxy", "registry.example.com/cloudsql/cloud-sql-proxy:2.11.4", ("tcp-sql", 5432)),
    ("config-reloader", "registry.example.com/jimmidyson/configmap-reload:v0.13.1", ("reloader-web", 9533)),
    ("metrics-exporter", "registry.example.com/prometheus/statsd-exporter:v0.26.1", ("metrics", 9102)),
)
_ENV_POOL = (
    ("LOG_LEVEL", "info"),
    ("LOG_FORMAT", "json"),
    ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://otel-collector.observability.svc.cluster.local:4317"),
    ("OTEL_SERVICE_NAME", "{app}"),
    ("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment={env},service.namespace={ns}"),
    ("GOMAXPROCS", "2"),
    ("GOMEMLIMIT", "460MiB"),
    ("JAVA_TOOL_OPTIONS", "-XX:MaxRAMPercentage=75.0 -XX:+UseG1GC -XX:+ExitOnOutOfMemoryError"),
    ("DATABASE_HOST", "postgres.{ns}.svc.cluster.local"),
    ("DATABASE_PORT", "5432"),
    ("DATABASE_NAME", "{app}"),
    ("REDIS_URL", "redis://redis-master.{ns}.svc.cluster.local:6379/0"),
    ("KAFKA_BROKERS", "kafka-0.kafka-headless.{ns}.svc:9092,kafka-1.kafka-headless.{ns}.svc:9092"),
    ("FEATURE_FLAGS_URL", "http://flagd.platform.svc.cluster.local:8013"),
    ("HTTP_TIMEOUT_SECONDS", "30"),
    ("MAX_CONNECTIONS", "200"),
    ("CACHE_TTL_SECONDS", "300"),
    ("SENTRY_ENVIRONMENT", "{env}"),
    ("SENTRY_DSN", "https://0123456789abcdef@sentry.example.com/42"),
    ("TZ", "UTC"),
    ("ENABLE_PROFILING", "false"),
    ("WORKER_CONCURRENCY", "8"),
    ("METRICS_PORT", "9090"),
    ("GRPC_GO_RETRY", "on"),
    ("S3_BUCKET", "{ns}-{app}-artifacts"),
    ("AWS_REGION", "eu-central-1"),
    ("UPSTREAM_TIMEOUT", "5s"),
    ("RATE_LIMIT_PER_SECOND", "500"),
    ("CONFIG_PATH", "/etc/{app}/config.yaml"),
    ("NODE_OPTIONS", "--max-old-space-size=384"),
)
_FIELD_ENV: list[dict[str, Any]] = [
    {"name": "POD_IP", "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "status.podIP"}}},
]
# How often an app's template has each optional part (what makes pods differ in size).
_READINESS, _LIVENESS, _RESOURCES = 0.4, 0.5, 0.8
_SIDECAR_WEIGHTS = (34, 5, 1)  # 0, 1 or 2 sidecars
_MAIN_ENV = 1  # entries of _ENV_POOL every main container has; the rest pads pods to size
_TOLERATIONS = [
    {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300},
    {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300},
]
_CONDITIONS = ("Initialized", "Ready", "ContainersReady", "PodScheduled")
# Lists that server-side apply keys by these fields (the rest are atomic: ``"f:args": {}``).
_KEYED = {
    "containers": ("name",),
    "initContainers": ("name",),
    "ports": ("containerPort", "protocol"),
    "env": ("name",),
    "volumeMounts": ("mountPath",),
    "volumes": ("name",),
    "conditions": ("type",),
    "podIPs": ("ip",),
    "hostIPs": ("ip",),
    "ownerReferences": ("uid",),
    "items": ("key",),
}
_OPAQUE_ITEMS = ("ownerReferences",)
_REQUIRED_LISTS = ("containers", "conditions")  # always there: no ``".": {}`` of their own
# What admission plugins add to a pod (ServiceAccount, DefaultTolerationSeconds, Priority): the
# controller never sent these, so its managedFields entry does not name them.
_ADMITTED = ("volumes", "tolerations", "priority", "preemptionPolicy", "serviceAccount", "serviceAccountName")
_TOKEN_MOUNT = "/var/run/secrets/kubernetes.io/serviceaccount"  # keyed, but each item is owned whole: ``"k:{…}": {}``
_BY_KIND: dict[str, Resource] = {r.kind: r for r in (NAMESPACES, NODECONFIGS, NETWORKPOLICIES, PODS)}


def resource_of(obj: Mapping[str, Any]) -> Resource:
    """The fake API server's resource for a generated object."""
    return _BY_KIND[obj["kind"]]


def compact_size(obj: Any) -> int:
    """Bytes of *obj* as compact JSON (kube-apiserver's encoding)."""
    return len(json.dumps(obj, separators=_COMPACT))


def fields_v1(obj: Mapping[str, Any]) -> dict[str, Any]:
    """The fieldsV1 tree of the fields in *obj* (a map below the object's top level)."""
    return {f"f:{key}": _field(key, value) for key, value in obj.items()}


def _field(key: str, value: Any) -> dict[str, Any]:
    if isinstance(value, dict):
        return {".": {}, **fields_v1(value)} if value else {}
    if isinstance(value, list) and key in _KEYED:
        tree: dict[str, Any] = {} if key in _REQUIRED_LISTS else {".": {}}
        for item in value:
            ident = json.dumps({k: item[k] for k in _KEYED[key]}, sort_keys=True, separators=_COMPACT)
            tree[f"k:{ident}"] = {} if key in _OPAQUE_ITEMS else {".": {}, **fields_v1(item)}
        return tree
    return {}


def _managed(manager: str, when: str, owned: Mapping[str, Any], subresource: str = "") -> dict[str, Any]:
    entry = {
        "manager": manager,
        "operation": "Update",
        "apiVersion": "v1",
        "time": when,
        "fieldsType": "FieldsV1",
        "fieldsV1": {f"f:{key}": fields_v1(value) for key, value in owned.items()},
    }
    if subresource:
        entry["subresource"] = subresource
    return entry


def _stamp(seconds: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(_EPOCH + int(seconds)))


def _rand(rng: random.Random, n: int) -> str:
    return "".join(rng.choice(_RAND_CHARS) for _ in range(n))


def _uid(rng: random.Random) -> str:
    return str(uuid.UUID(int=rng.getrandbits(128), version=4))


def _hex(rng: random.Random, bits: int = 256) -> str:
    return f"{rng.getrandbits(bits):0{bits // 4}x}"


@attrs.frozen
class ClusterShape:
    """How big the cluster is.  Presets keep 30 pods a node and 75 a namespace."""

    pods: int = attrs.field(default=150_000, validator=attrs.validators.ge(1))
    nodes: int = attrs.field(default=5_000, validator=[attrs.validators.ge(1), attrs.validators.le(65_536)])
    namespaces: int = attrs.field(default=2_000, validator=attrs.validators.ge(1))
    policies: int = attrs.field(default=2_000, validator=attrs.validators.ge(0))
    seed: int = 1
    local_node: int = 0  # the node the agent under test runs as

    @classmethod
    def preset(cls, name: str, **changes: Any) -> ClusterShape:
        try:
            base = PRESETS[name]
        except KeyError:
            raise ValueError(f"unknown preset {name!r}: expected one of {', '.join(PRESETS)}") from None
        return attrs.evolve(base, **changes)

    @property
    def name(self) -> str:
        return f"{self.pods // 1000}k" if self.pods % 1000 == 0 else str(self.pods)


PRESETS = {
    "3k": ClusterShape(3_000, 100, 40, 40),
    "30k": ClusterShape(30_000, 1_000, 400, 400),
    "150k": ClusterShape(),
}


@attrs.frozen
class App:
    """One workload: its replicas are pods ``first … first + replicas - 1``."""

    namespace: int
    name: str
    kind: str  # the owner: ReplicaSet, StatefulSet or DaemonSet
    first: int
    replicas: int


@attrs.frozen
class PodChange:
    """One change of a remote pod, as the API writes that make it.

    ``kind``: "labels" (a merge patch of metadata.labels), "status" (a merge
    patch of the status subresource, as the kubelet sends on a restart) or
    "recreate" (the pod deleted and its replacement, with a new uid and
    address, created: a rollout or an evicted replica).
    """

    kind: str
    namespace: str
    name: str
    body: dict[str, Any]  # the patch, the status patch, or the replacement pod

    def requests(self) -> list[tuple[str, str, dict[str, Any] | None, str]]:
        """(method, path, body, content type) of each API request, in order."""
        path = f"/api/v1/namespaces/{self.namespace}/pods/{self.name}"
        merge = "application/merge-patch+json"
        if self.kind == "labels":
            return [("PATCH", path, self.body, merge)]
        if self.kind == "status":
            return [("PATCH", path + "/status", self.body, merge)]
        return [
            # Removed at once, as a kubelet's final DELETE (a bound pod given a grace would only be marked).
            ("DELETE", path + "?gracePeriodSeconds=0", None, "application/json"),
            ("POST", f"/api/v1/namespaces/{self.namespace}/pods", self.body, "application/json"),
        ]


@attrs.define(eq=False)
class _Template:
    """What an app's replicas share (labels, containers, volumes), made once per app."""

    app: App
    namespace: str
    team: str
    env: str
    template_hash: str
    labels: dict[str, str]
    annotations: dict[str, str]
    owner: dict[str, Any]
    containers: list[dict[str, Any]]
    volumes: list[dict[str, Any]]
    port: tuple[str, int]
    spec_extra: dict[str, Any]
    created: float


@attrs.define(eq=False)
class ScaleCluster:
    """The objects of one :class:`ClusterShape`; every object is made on demand."""

    shape: ClusterShape
    apps: list[App] = attrs.field(init=False)
    _firsts: list[int] = attrs.field(init=False)
    _by_namespace: list[range] = attrs.field(init=False)  # namespace k's apps: self.apps[range]
    _stride: int = attrs.field(init=False)
    _inverse: int = attrs.field(init=False)
    _cached: _Template | None = attrs.field(init=False, default=None)

    def __attrs_post_init__(self) -> None:
        s = self.shape
        apps: list[App] = []
        by_namespace: list[range] = []
        first = 0
        for k in range(s.namespaces):
            start = len(apps)
            count = s.pods // s.namespaces + (1 if k < s.pods % s.namespaces else 0)
            rng = random.Random(f"{s.seed}/ns/{k}")
            used: set[str] = set()
            while count > 0:
                if k == 0 and not apps:
                    name, kind, replicas = "prometheus", "StatefulSet", 2  # the peer other policies name
                else:
                    stateful = rng.random() < 0.12
                    name = rng.choice(_STATEFUL if stateful else _APPS)
                    kind = "StatefulSet" if stateful else ("DaemonSet" if rng.random() < 0.03 else "ReplicaSet")
                    replicas = rng.choice(_REPLICAS)
                base, n = name, 2
                while name in used:
                    name, n = f"{base}-{n}", n + 1
                used.add(name)
                replicas = min(replicas, count)
                apps.append(App(k, name, kind, first, replicas))
                first += replicas
                count -= replicas
            by_namespace.append(range(start, len(apps)))
        self.apps, self._by_namespace = apps, by_namespace
        self._firsts = [a.first for a in apps]
        # Pod i runs on node (i * stride) % nodes: each node gets its share, and an
        # app's replicas land on nodes far apart.
        stride = max(1, int(s.nodes * 0.618)) | 1
        while _gcd(stride, s.nodes) != 1:
            stride += 2
        self._stride, self._inverse = stride, pow(stride, -1, s.nodes) if s.nodes > 1 else 0

    # ---- layout ----------------------------------------------------------------

    def node_name(self, m: int) -> str:
        return f"node-{m:05d}"

    @property
    def local_node_name(self) -> str:
        return self.node_name(self.shape.local_node)

    def node_of(self, i: int) -> int:
        return (i * self._stride) % self.shape.nodes

    def node_cidr6(self, m: int) -> str:
        return LOCAL_CIDR6 if m == self.shape.local_node else f"fd00:0:0:{m:x}::/64"

    def is_local(self, i: int) -> bool:
        return self.node_of(i) == self.shape.local_node

    def local_pods(self) -> list[int]:
        """Indices of the pods on the local node, in order."""
        s = self.shape
        first = (s.local_node * self._inverse) % s.nodes if s.nodes > 1 else 0
        return list(range(first, s.pods, s.nodes))

    def app_of(self, i: int) -> App:
        if not 0 <= i < self.shape.pods:
            raise IndexError(f"pod {i} is not in a cluster of {self.shape.pods}")
        return self.apps[bisect.bisect_right(self._firsts, i) - 1]

    def namespace_name(self, k: int) -> str:
        if k == 0:
            return "monitoring"
        n = len(_TEAMS) * len(_ENVS)
        name = f"{_TEAMS[k % len(_TEAMS)]}-{_ENVS[(k // len(_TEAMS)) % len(_ENVS)]}"
        return name if k < n else f"{name}-{k // n}"

    def _team_env(self, k: int) -> tuple[str, str]:
        if k == 0:
            return "platform", "prod"
        return _TEAMS[k % len(_TEAMS)], _ENVS[(k // len(_TEAMS)) % len(_ENVS)]

    # ---- objects ---------------------------------------------------------------

    def objects(self) -> Iterator[Object]:
        """Every object, in the order to create them: Namespaces, NodeConfigs, NetworkPolicies, Pods."""
        for k in range(self.shape.namespaces):
            yield self.namespace(k)
        for m in range(self.shape.nodes):
            yield self.nodeconfig(m)
        for j in range(self.shape.policies):
            yield self.network_policy(j)
        for i in range(self.shape.pods):
            yield self.pod(i)

    def namespace(self, k: int) -> Object:
        name = self.namespace_name(k)
        team, env = self._team_env(k)
        rng = random.Random(f"{self.shape.seed}/nsobj/{k}")
        labels = {"kubernetes.io/metadata.name": name, "team": team, "env": env}
        if rng.random() < 0.4:
            labels["istio-injection"] = "enabled"
        created = _stamp(rng.randrange(86400 * 30))
        return {
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {
                "name": name,
                "uid": _uid(rng),
                "resourceVersion": str(100 + k),
                "creationTimestamp": created,
                "labels": labels,
                "managedFields": [
                    {
                        "manager": "argocd-controller",
                        "operation": "Apply",
                        "apiVersion": "v1",
                        "time": created,
                        "fieldsType": "FieldsV1",
                        "fieldsV1": {"f:metadata": fields_v1({"labels": {k: labels[k] for k in ("team", "env")}})},
                    }
                ],
            },
            "spec": {"finalizers": ["kubernetes"]},
            "status": {"phase": "Active"},
        }

    def nodeconfig(self, m: int) -> Object:
        rng = random.Random(f"{self.shape.seed}/node/{m}")
        base4 = ("198.51.100", "203.0.113")[(m // 256) % 2]
        return {
            "apiVersion": "flock.fritzlab.net/v1alpha1",
            "kind": "NodeConfig",
            "metadata": {
                "name": self.node_name(m),
                "uid": _uid(rng),
                "resourceVersion": str(10_000 + m),
                "creationTimestamp": _stamp(rng.randrange(86400)),
                "generation": 1,
            },
            "spec": {
                "cidr6": self.node_cidr6(m),
                "families": {"ipv6": True, "ipv4": False},
                "bgp": {
                    "asn": 4_200_000_000 + m,
                    # An identifier only (no two nodes of a lab peer by it): from the documentation ranges.
                    "routerID": f"{base4}.{m % 256}",
                    "peers": [{"name": "tor", "address": "2001:db8:ffff::1", "asn": 64500}],
                },
            },
        }

    def network_policy(self, j: int) -> Object:
        """Policy *j*: in namespace ``j % namespaces``, it selects one app by label and
        lets in another app of the namespace on its port (named or numeric); some
        also let in Prometheus from "monitoring", or every pod of the team's namespaces."""
        k = j % self.shape.namespaces
        rng = random.Random(f"{self.shape.seed}/policy/{j}")
        apps = self._namespace_apps(k)
        target = apps[(j // self.shape.namespaces) % len(apps)]
        peer = rng.choice(apps)
        port_name, port = self._port(target)
        rules: list[dict[str, Any]] = [
            {
                "from": [{"podSelector": {"matchLabels": {"app": peer.name}}}],
                "ports": [{"protocol": "TCP", "port": port_name if rng.random() < 0.5 else port}],
            }
        ]
        if rng.random() < 0.3:
            rules.append(
                {
                    "from": [
                        {
                            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}},
                            "podSelector": {"matchLabels": {"app": "prometheus"}},
                        }
                    ],
                    "ports": [{"protocol": "TCP", "port": 9090}],
                }
            )
        if rng.random() < 0.2:
            team, _ = self._team_env(k)
            rules.append({"from": [{"namespaceSelector": {"matchLabels": {"team": team}}}]})
        spec = {"podSelector": {"matchLabels": {"app": target.name}}, "ingress": rules, "policyTypes": ["Ingress"]}
        return self._policy_object(self.namespace_name(k), f"allow-{target.name}-ingress", spec, rng)

    def selecting_policy(self, i: int, name: str) -> Object:
        """A new NetworkPolicy selecting pod *i*'s app: ingress from the same app on its named port."""
        app = self.app_of(i)
        port_name, _ = self._port(app)
        spec = {
            "podSelector": {"matchLabels": {"app": app.name}},
            "ingress": [
                {
                    "from": [{"podSelector": {"matchLabels": {"app": app.name}}}],
                    "ports": [{"protocol": "TCP", "port": port_name}],
                }
            ],
            "policyTypes": ["Ingress"],
        }
        return self._policy_object(
            self.namespace_name(app.namespace), name, spec, random.Random(f"{self.shape.seed}/{name}")
        )

    def pod(self, i: int, generation: int = 0, restarts: int = 0) -> Object:
        """Pod *i* (its *generation*-th incarnation after as many re-creates); a
        local pod is Pending without an address, any other Running."""
        t = self._template(self.app_of(i))
        app = t.app
        ordinal = i - app.first
        m = self.node_of(i)
        rng, created = self._pod_rng(i, generation, t)
        labels = dict(t.labels)
        meta: dict[str, Any] = {}
        if app.kind == "StatefulSet":
            name = f"{app.name}-{ordinal}"
            labels["apps.kubernetes.io/pod-index"] = str(ordinal)
            labels["statefulset.kubernetes.io/pod-name"] = name
            meta["generateName"] = f"{app.name}-"
        elif app.kind == "DaemonSet":
            meta["generateName"] = f"{app.name}-"
            name = meta["generateName"] + _rand(rng, 5)
        else:
            meta["generateName"] = f"{app.name}-{t.template_hash}-"
            name = meta["generateName"] + _rand(rng, 5)
        meta = {
            "name": name,
            **meta,
            "namespace": t.namespace,
            "uid": _uid(rng),
            "resourceVersion": str(1_000_000 + i * 7 + generation),
            "creationTimestamp": _stamp(created),
            "labels": labels,
            "annotations": dict(t.annotations),
            "ownerReferences": [t.owner],
        }
        if not t.annotations:
            del meta["annotations"]
        containers = [dict(c) for c in t.containers]
        containers[0] = {**containers[0], "env": list(containers[0]["env"])}
        spec: dict[str, Any] = {"volumes": t.volumes, "containers": containers, **t.spec_extra}
        if app.kind == "StatefulSet":
            spec["hostname"], spec["subdomain"] = name, f"{app.name}-headless"
        pod: Object = {"metadata": meta, "spec": spec}
        if self.is_local(i) and generation == 0:
            status = self._pending_status(t, created)
        else:
            status = self._running_status(t, m, [self._address(m, rng)], created, rng, restarts)
        # Pad the main container's env to a drawn size: each entry's bytes (and its
        # managedFields entry's) are counted exactly, so the JSON is encoded only once here.
        owned = ("generateName", "labels", "annotations", "ownerReferences")
        controller = {"metadata": {k: meta[k] for k in owned if k in meta}}
        size = compact_size({**pod, "status": status}) + len('"apiVersion":"v1","kind":"Pod",')
        size += len(',"managedFields":[]') + 1 + len(',"nodeName":') + len(json.dumps(self.node_name(m)))
        size += compact_size(self._kcm(meta, spec, controller)) + compact_size(self._kubelet(status, created))
        target = MAX_POD_BYTES - int((MAX_POD_BYTES - MIN_POD_BYTES) * rng.random() ** _SIZE_SKEW)
        env, pool = containers[0]["env"], _ENV_POOL[_MAIN_ENV:]
        for n in range(64):
            key, value = pool[n] if n < len(pool) else (f"FEATURE_{n:02d}_ENABLED", "true")
            entry = {"name": key, "value": value.format(app=app.name, ns=t.namespace, env=t.env)}
            ident = json.dumps("k:" + json.dumps({"name": key}, separators=_COMPACT))
            cost = 2 + compact_size(entry) + len(ident) + 1 + compact_size({".": {}, **fields_v1(entry)})
            if size + cost > target:
                break
            env.append(entry)
            size += cost
        meta["managedFields"] = [self._kcm(meta, spec, controller), self._kubelet(status, created)]
        spec["nodeName"] = self.node_name(m)
        return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec, "status": status}

    def running_status(self, i: int, ips: list[str], restarts: int = 0) -> dict[str, Any]:
        """Pod *i*'s Running status with *ips*, as the kubelet writes it once its sandbox has them."""
        t = self._template(self.app_of(i))
        rng, created = self._pod_rng(i, 0, t)
        return self._running_status(t, self.node_of(i), ips, created, rng, restarts)

    # ---- internals -------------------------------------------------------------

    def _namespace_apps(self, k: int) -> list[App]:
        return [self.apps[a] for a in self._by_namespace[k]]

    def _pod_rng(self, i: int, generation: int, t: _Template) -> tuple[random.Random, float]:
        """Pod *i*'s own random stream and its creation time (seconds after the epoch)."""
        rng = random.Random(f"{self.shape.seed}/pod/{i}/{generation}")
        return rng, t.created + 600 + rng.randrange(86400 * 7) + generation * 3600

    def _port(self, app: App) -> tuple[str, int]:
        return self._template(app).port

    def _policy_object(self, namespace: str, name: str, spec: dict[str, Any], rng: random.Random) -> Object:
        created = _stamp(86400 * 30 + rng.randrange(86400 * 30))
        return {
            "apiVersion": "networking.k8s.io/v1",
            "kind": "NetworkPolicy",
            "metadata": {
                "name": name,
                "namespace": namespace,
                "uid": _uid(rng),
                "resourceVersion": str(50_000 + rng.randrange(10_000)),
                "generation": 1,
                "creationTimestamp": created,
                "labels": {"app.kubernetes.io/managed-by": "argocd"},
                "managedFields": [
                    {
                        "manager": "argocd-controller",
                        "operation": "Apply",
                        "apiVersion": "networking.k8s.io/v1",
                        "time": created,
                        "fieldsType": "FieldsV1",
                        "fieldsV1": {"f:spec": fields_v1(spec)},
                    }
                ],
            },
            "spec": spec,
        }

    def _template(self, app: App) -> _Template:
        cached = self._cached  # one app's: replicas are made one after another
        if cached is not None and cached.app is app:
            return cached
        k = app.namespace
        ns = self.namespace_name(k)
        team, env = self._team_env(k)
        rng = random.Random(f"{self.shape.seed}/app/{k}/{app.name}")
        version = f"v{rng.randrange(1, 4)}.{rng.randrange(30)}.{rng.randrange(10)}"
        template_hash = _rand(rng, 10)
        revision = f"{app.name}-{_rand(rng, 10)}"
        labels = {"app": app.name, "version": version}
        labels["tier"] = "data" if app.kind == "StatefulSet" else rng.choice(("frontend", "backend", "worker"))
        if app.kind == "ReplicaSet":
            labels["pod-template-hash"] = template_hash
            owner_name = f"{app.name}-{template_hash}"
        else:
            labels["controller-revision-hash"] = revision
            owner_name = app.name
            if app.kind == "DaemonSet":
                labels["pod-template-generation"] = str(rng.randrange(1, 9))
        annotations = {}
        if rng.random() < 0.4:
            annotations["kubectl.kubernetes.io/restartedAt"] = _stamp(rng.randrange(86400 * 60))
        if rng.random() < 0.5:
            annotations |= {"prometheus.io/scrape": "true", "prometheus.io/port": "9090"}
        owner = {
            "apiVersion": "apps/v1",
            "kind": app.kind,
            "name": owner_name,
            "uid": _uid(rng),
            "controller": True,
            "blockOwnerDeletion": True,
        }
        port = _STATEFUL_PORTS.get(app.name.split("-")[0]) or rng.choice(_PORTS)
        token = f"kube-api-access-{_rand(rng, 5)}"
        mount = {"name": token, "readOnly": True, "mountPath": _TOKEN_MOUNT}
        fmt = {"app": app.name, "ns": ns, "env": env}
        main_env = [{"name": k, "value": v.format(**fmt)} for k, v in _ENV_POOL[:_MAIN_ENV]]
        if rng.random() < 0.4:
            main_env.insert(0, _FIELD_ENV[0])
        main = self._container(rng, app.name, f"registry.example.com/{team}/{app.name}:{version}", port, mount)
        main["env"] = main_env
        http_get = {"path": "/healthz", "port": port[0], "scheme": "HTTP"}
        probe: dict[str, Any] = {"httpGet": http_get, "initialDelaySeconds": rng.choice((0, 5, 10))}
        probe |= {"timeoutSeconds": 1, "periodSeconds": 10, "successThreshold": 1, "failureThreshold": 3}
        if rng.random() < _READINESS:
            main["readinessProbe"] = {**probe, "httpGet": {**http_get, "path": "/ready"}, "periodSeconds": 5}
            if rng.random() < _LIVENESS:
                main["livenessProbe"] = probe
        containers = [main]
        for sidecar, image, side_port in rng.sample(_SIDECARS, rng.choices((0, 1, 2), _SIDECAR_WEIGHTS)[0]):
            sidecar_port = side_port if rng.random() < 0.3 else None
            containers.append(self._container(rng, sidecar, image, sidecar_port, mount))
        volumes = [
            {
                "name": token,
                "projected": {
                    "sources": [
                        {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
                        {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                        {
                            "downwardAPI": {
                                "items": [
                                    {
                                        "path": "namespace",
                                        "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"},
                                    }
                                ]
                            }
                        },
                    ],
                    "defaultMode": 420,
                },
            },
        ]
        spec_extra: dict[str, Any] = {
            "restartPolicy": "Always",
            "terminationGracePeriodSeconds": 30,
            "dnsPolicy": "ClusterFirst",
            "serviceAccountName": "default",
            "serviceAccount": "default",
            "securityContext": {},
            "schedulerName": "default-scheduler",
            "tolerations": _TOLERATIONS,
            "priority": 0,
            "enableServiceLinks": False,
            "preemptionPolicy": "PreemptLowerPriority",
        }
        self._cached = _Template(
            app,
            ns,
            team,
            env,
            template_hash,
            labels,
            annotations,
            owner,
            containers,
            volumes,
            port,
            spec_extra,
            float(rng.randrange(86400 * 60)),
        )
        return self._cached

    @staticmethod
    def _container(
        rng: random.Random, name: str, image: str, port: tuple[str, int] | None, mount: dict[str, Any]
    ) -> dict[str, Any]:
        out: dict[str, Any] = {"name": name, "image": image}
        if port is not None:
            out["ports"] = [{"name": port[0], "containerPort": port[1], "protocol": "TCP"}]
        if rng.random() < _RESOURCES:
            cpu, memory = rng.choice((50, 100, 200, 250, 500)), rng.choice((64, 128, 256, 512))
            out["resources"] = {
                "limits": {"memory": f"{memory * 2}Mi"},
                "requests": {"cpu": f"{cpu}m", "memory": f"{memory}Mi"},
            }
        else:
            out["resources"] = {}
        out["volumeMounts"] = [dict(mount)]
        out["terminationMessagePath"] = "/dev/termination-log"
        out["terminationMessagePolicy"] = "File"
        out["imagePullPolicy"] = "IfNotPresent"
        return out

    def _address(self, m: int, rng: random.Random) -> str:
        block = ipaddress.IPv6Network(self.node_cidr6(m))
        return str(block.network_address + (rng.getrandbits(32) | 1))

    @staticmethod
    def _host_ip(m: int) -> str:
        return f"fd00:ffff::{m + 1:x}"

    def _running_status(
        self, t: _Template, m: int, ips: list[str], created: float, rng: random.Random, restarts: int
    ) -> dict[str, Any]:
        started = created + 2 + rng.randrange(20)
        statuses = []
        for c in t.containers:
            repo = c["image"].rsplit(":", 1)[0]
            running_since = started + restarts * 300
            status: dict[str, Any] = {
                "name": c["name"],
                "state": {"running": {"startedAt": _stamp(running_since)}},
                "lastState": {},
                "ready": True,
                "restartCount": restarts,
                "image": c["image"],
                "imageID": f"{repo}@sha256:{_hex(rng)}",
                "containerID": f"containerd://{_hex(rng)}",
                "started": True,
            }
            if restarts:
                status["lastState"] = {
                    "terminated": {
                        "exitCode": 137,
                        "reason": "OOMKilled",
                        "startedAt": _stamp(running_since - 300),
                        "finishedAt": _stamp(running_since - 1),
                        "containerID": f"containerd://{_hex(rng)}",
                    }
                }
            statuses.append(status)
        ready_at = _stamp(started + 8 + restarts * 300)
        return {
            "phase": "Running",
            "conditions": [
                {
                    "type": kind,
                    "status": "True",
                    "lastProbeTime": None,
                    "lastTransitionTime": ready_at if kind in ("Ready", "ContainersReady") else _stamp(created + 1),
                }
                for kind in _CONDITIONS
            ],
            "hostIP": self._host_ip(m),
            "podIP": ips[0],
            "podIPs": [{"ip": ip} for ip in ips],
            "startTime": _stamp(created + 1),
            "containerStatuses": statuses,
            "qosClass": "Burstable",
        }

    def _pending_status(self, t: _Template, created: float) -> dict[str, Any]:
        m = self.shape.local_node
        return {
            "phase": "Pending",
            "conditions": [
                {"type": "PodScheduled", "status": "True", "lastProbeTime": None, "lastTransitionTime": _stamp(created)}
            ],
            "hostIP": self._host_ip(m),
            "startTime": _stamp(created + 1),
            "containerStatuses": [
                {
                    "name": c["name"],
                    "state": {"waiting": {"reason": "ContainerCreating"}},
                    "lastState": {},
                    "ready": False,
                    "restartCount": 0,
                    "image": c["image"],
                    "imageID": "",
                    "started": False,
                }
                for c in t.containers
            ],
            "qosClass": "Burstable",
        }

    @staticmethod
    def _kcm(meta: Mapping[str, Any], spec: Mapping[str, Any], controller: Mapping[str, Any]) -> dict[str, Any]:
        """The ReplicaSet/StatefulSet/DaemonSet controller's entry: what it sent, before admission."""
        sent = {k: v for k, v in spec.items() if k not in _ADMITTED}
        containers = []
        for c in spec["containers"]:
            mounts = [m for m in c.get("volumeMounts", ()) if m["mountPath"] != _TOKEN_MOUNT]
            containers.append(
                {k: v for k, v in c.items() if k != "volumeMounts"} | ({"volumeMounts": mounts} if mounts else {})
            )
        sent["containers"] = containers
        return _managed("kube-controller-manager", meta["creationTimestamp"], {**controller, "spec": sent})

    @staticmethod
    def _kubelet(status: Mapping[str, Any], created: float) -> dict[str, Any]:
        owned = {k: v for k, v in status.items() if k not in ("containerStatuses", "qosClass")}
        owned["containerStatuses"] = []  # atomic: "f:containerStatuses": {}
        return _managed("kubelet", _stamp(created + 30), {"status": owned}, "status")


@attrs.define(eq=False)
class Churn:
    """The next change of a remote pod, again and again (deterministic per seed).

    Of every ten changes about four are status updates (a container restarted),
    three label changes and three re-creates (delete + create: new uid, new
    address; a StatefulSet's replica keeps its name).  Local pods never change.
    """

    cluster: ScaleCluster
    seed: int = 7
    _rng: random.Random = attrs.field(init=False)
    _generation: dict[int, int] = attrs.field(init=False, factory=dict)
    _restarts: dict[int, int] = attrs.field(init=False, factory=dict)
    _relabels: dict[int, int] = attrs.field(init=False, factory=dict)

    def __attrs_post_init__(self) -> None:
        self._rng = random.Random(f"{self.cluster.shape.seed}/churn/{self.seed}")
        if len(self.cluster.local_pods()) == self.cluster.shape.pods:
            raise ValueError("every pod is on the local node: no remote pod to change")

    def current_name(self, i: int) -> tuple[str, str]:
        """(namespace, name) of pod *i* now."""
        meta = self.cluster.pod(i, self._generation.get(i, 0))["metadata"]
        return meta["namespace"], meta["name"]

    def next(self) -> PodChange:
        while True:
            i = self._rng.randrange(self.cluster.shape.pods)
            if not self.cluster.is_local(i):
                break
        roll = self._rng.random()
        generation = self._generation.get(i, 0)
        current = self.cluster.pod(i, generation, self._restarts.get(i, 0))
        ns, name = current["metadata"]["namespace"], current["metadata"]["name"]
        if roll < 0.4:
            restarts = self._restarts[i] = self._restarts.get(i, 0) + 1
            status = self.cluster.pod(i, generation, restarts)["status"]
            body = {"status": {k: status[k] for k in ("conditions", "containerStatuses")}}
            return PodChange("status", ns, name, body)
        if roll < 0.7:
            n = self._relabels[i] = self._relabels.get(i, 0) + 1
            patch = {
                "metadata": {"labels": {"rollout.example.com/canary": str(n % 2 == 1).lower(), "version": f"v9.{n}.0"}}
            }
            return PodChange("labels", ns, name, patch)
        self._generation[i] = generation + 1
        self._restarts.pop(i, None)
        self._relabels.pop(i, None)
        replacement = self.cluster.pod(i, generation + 1)
        for key in ("uid", "resourceVersion", "creationTimestamp", "managedFields"):
            replacement["metadata"].pop(key, None)
        return PodChange("recreate", ns, name, replacement)


def average_pod_size(cluster: ScaleCluster, sample: int = 500) -> dict[str, float]:
    """Compact-JSON bytes of an evenly spread sample of *cluster*'s pods: mean, min, max."""
    step = max(1, cluster.shape.pods // sample)
    sizes = [compact_size(cluster.pod(i)) for i in range(0, cluster.shape.pods, step)]
    return {"mean": sum(sizes) / len(sizes), "min": min(sizes), "max": max(sizes), "n": len(sizes)}


def _gcd(a: int, b: int) -> int:
    while b:
        a, b = b, a % b
    return a


__all__ = [
    "LOCAL_CIDR6",
    "PRESETS",
    "App",
    "Churn",
    "ClusterShape",
    "PodChange",
    "ScaleCluster",
    "average_pod_size",
    "compact_size",
    "fields_v1",
    "resource_of",
]
