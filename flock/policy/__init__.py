"""NetworkPolicy: a pure compiler and an nftables applier.

README-interface (how the watchers feed the policy service)
-----------------------------------------------------------

Values (``flock.policy._model``), each with a validating ``from_object(dict)``
that takes the Kubernetes object in its JSON (camelCase) form and raises
:class:`flock.model.InvalidObject` naming the bad field (log it, skip the object):

- :class:`NetworkPolicy` (``policy_types`` defaulted exactly as the API server
  does), :class:`PolicyRule`, :class:`Peer`, :class:`LabelSelector` (with
  :class:`Requirement` matchExpressions), :class:`IPBlock`, :class:`PolicyPort`;
- :class:`Namespace` (name, labels; ``kubernetes.io/metadata.name`` is implied;
  ``log_denied`` from its ``flock.fritzlab.net/log-denied`` annotation: drops of
  its pods' traffic are logged, see ``flock.policy._denylog``);
- :class:`PolicyPod` (namespace, name, labels, addresses from status.podIPs,
  named container ports, node; ``host_veth`` is None from the API object and is
  set by the agent only for pods attached on this node; ``selectable`` False
  for hostNetwork and Succeeded/Failed pods).

- :class:`ClusterNetworkPolicy` (``policy.networking.k8s.io/v1alpha2``: tier,
  priority, subject, rules whose unreadable parts fail closed, see
  ``flock.policy._cluster``) and :class:`PolicyNode` (a Node's labels and
  addresses, for ``nodes`` peers).

The cluster-wide watchers (policy-lab: NetworkPolicy, Namespace, Pod in every
namespace; ClusterNetworkPolicy; Node while ``inputs.nodes_needed``) write into
ONE :class:`PolicyInputs` built by the composition root and passed to them and
to the policy service::

    inputs = PolicyInputs()
    # watcher, after each (re)list:  inputs.replace(Kind.POD, {p.key: p for p in pods})   (also marks synced)
    # watcher, per watch event:      inputs.set_pod(p) / inputs.delete(Kind.POD, "ns/name")
    #                                inputs.set_policy(p) / inputs.delete(Kind.NETWORK_POLICY, "ns/name")
    #                                inputs.set_namespace(n) / inputs.delete(Kind.NAMESPACE, "name")
    # policy service:                journal = inputs.journal(); read inputs.pods/namespaces/policies once;
    #                                then per wake-up (inputs.wait_generation): journal.drain() → changed keys

Keys: ``"ns/name"`` for policies and pods, the name for namespaces,
ClusterNetworkPolicies and Nodes.  Setting an equal value is a no-op (no
wake-up).  Values are kept as given (shared with the watchers, never copied);
``inputs.snapshot()`` copies everything and is for tools and tests, not per
change.  The service applies nothing until every kind it needs is synced
(``inputs.complete``: NetworkPolicy, Namespace, Pod, ClusterNetworkPolicy, and
Node while some ClusterNetworkPolicy has a ``nodes`` peer), so after a restart
the old kernel table stays until a ruleset from a complete view replaces it.

The compiler is a pure function::

    compile_ruleset(policies, namespaces, pods, local_pods, cluster_policies=(), nodes=()) -> Ruleset

``pods`` are all pods known cluster-wide; ``local_pods`` are this node's
attached pods (``host_veth`` set, addresses from the allocation); a local pod
overrides the cluster-wide entry with the same key.  :class:`Compiler` is the
same with caches; :func:`evaluate` is the reference semantics.
:class:`PolicyEngine` (the agent's) computes the same ruleset once and then
follows the inputs' changes, doing work in proportion to the selectors a
change touches, and hands :class:`RulesetChange` values (set elements that
moved, the structure when it changed) to the applier.

The rest: :class:`NftApplier` (full replace or incremental change, one
transaction each) over :class:`LibNftables` or :class:`NftCommand`
(``flock.testing.policy.MemoryApplier`` is the same in memory, for tests
and benchmarks), and :class:`PolicyService`, the supervised loop (inputs'
changes + this node's allocations → engine → apply, retried with backoff, readiness gate
:data:`POLICY_GATE`, :class:`PolicyMetrics`) whose :meth:`PolicyService.ensure`
is the ADD gate (:class:`PolicyGate`).
"""

from ._apply import ApplyResult, NftApplier
from ._backend import LibNftables, NftBackend, NftCommand, NftError, default_backend
from ._cluster import (
    Action,
    ClusterNetworkPolicy,
    ClusterPeer,
    ClusterPort,
    ClusterRule,
    PolicyNode,
    Tier,
)
from ._compile import HOST_VETH, Compiler, InvalidLocalPod, block_prefixes, compile_ruleset, pod_chain, policy_chain
from ._denylog import DENY_LOG_GROUP, DenyLogService, nflog_socket, open_nflog
from ._engine import PolicyEngine
from ._explain import (
    AgentView,
    DirectionVerdict,
    Explanation,
    Party,
    PathStep,
    Query,
    Verdict,
    explain,
    explanation_text,
)
from ._inputs import InputChanges, InputJournal, Kind, PolicyInputs, PolicySnapshot, PolicySource, nodes_needed
from ._metrics import DeniedCounters, PolicyMetrics
from ._model import (
    LOG_DENIED_ANNOTATION,
    NAMESPACE_NAME_LABEL,
    Direction,
    IPBlock,
    Labels,
    LabelSelector,
    NamedPort,
    Namespace,
    NetworkPolicy,
    Operator,
    Peer,
    PolicyPod,
    PolicyPort,
    PolicyRule,
    Protocol,
    Requirement,
    labels_field,
)
from ._nfnetlink import Flow
from ._reference import Endpoint, evaluate
from ._ruleset import (
    EGRESS_MAP,
    INGRESS_MAP,
    AddressSet,
    Chain,
    Denial,
    DenyLog,
    Match,
    Rule,
    Ruleset,
    RulesetChange,
    ServiceSet,
)
from ._service import (
    POLICY_GATE,
    WAITING_FOR_WATCHERS,
    LocalPods,
    PolicyGate,
    PolicyService,
    Readiness,
    RulesetApplier,
    Watermark,
)
from ._simulate import (
    Packet,
    Trace,
    TraceStep,
    forward_verdict,
    input_verdict,
    trace_egress,
    trace_ingress,
    trace_input,
)
from ._trace import (
    TRACE_TABLE,
    Captured,
    KernelTrace,
    Target,
    Verification,
    kernel_trace,
    place_rules,
    verification_of,
    verify,
    verify_plan,
)
from ._tracer import TraceError, Tracer

__all__ = [
    "DENY_LOG_GROUP",
    "EGRESS_MAP",
    "HOST_VETH",
    "INGRESS_MAP",
    "LOG_DENIED_ANNOTATION",
    "NAMESPACE_NAME_LABEL",
    "POLICY_GATE",
    "TRACE_TABLE",
    "WAITING_FOR_WATCHERS",
    "Action",
    "AddressSet",
    "AgentView",
    "ApplyResult",
    "Captured",
    "Chain",
    "ClusterNetworkPolicy",
    "ClusterPeer",
    "ClusterPort",
    "ClusterRule",
    "Compiler",
    "Denial",
    "DeniedCounters",
    "DenyLog",
    "DenyLogService",
    "Direction",
    "DirectionVerdict",
    "Endpoint",
    "Explanation",
    "Flow",
    "IPBlock",
    "InputChanges",
    "InputJournal",
    "InvalidLocalPod",
    "KernelTrace",
    "Kind",
    "LabelSelector",
    "Labels",
    "LibNftables",
    "LocalPods",
    "Match",
    "NamedPort",
    "Namespace",
    "NetworkPolicy",
    "NftApplier",
    "NftBackend",
    "NftCommand",
    "NftError",
    "Operator",
    "Packet",
    "Party",
    "PathStep",
    "Peer",
    "PolicyEngine",
    "PolicyGate",
    "PolicyInputs",
    "PolicyMetrics",
    "PolicyNode",
    "PolicyPod",
    "PolicyPort",
    "PolicyRule",
    "PolicyService",
    "PolicySnapshot",
    "PolicySource",
    "Protocol",
    "Query",
    "Readiness",
    "Requirement",
    "Rule",
    "Ruleset",
    "RulesetApplier",
    "RulesetChange",
    "ServiceSet",
    "Target",
    "Tier",
    "Trace",
    "TraceError",
    "TraceStep",
    "Tracer",
    "Verdict",
    "Verification",
    "Watermark",
    "block_prefixes",
    "compile_ruleset",
    "default_backend",
    "evaluate",
    "explain",
    "explanation_text",
    "forward_verdict",
    "input_verdict",
    "kernel_trace",
    "labels_field",
    "nflog_socket",
    "nodes_needed",
    "open_nflog",
    "place_rules",
    "pod_chain",
    "policy_chain",
    "trace_egress",
    "trace_ingress",
    "trace_input",
    "verification_of",
    "verify",
    "verify_plan",
]
