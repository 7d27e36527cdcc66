"""flockctl and the agent's admin socket (DESIGN: "what flockctl asks (local only)").

The agent side (:class:`AdminServer`, :class:`AdminOps`) is built by the
composition root; the command line is :func:`flock.ctl._cli.main`
(console script ``flockctl``).
"""

from flock.ctl._ops import AdminOps, OpRefused, Peer, PolicyWatch
from flock.ctl._protocol import ADMIN_PROTOCOL_VERSION, DEFAULT_ADMIN_SOCKET, AdminRefused, AdminUnreachable, ask
from flock.ctl._server import AdminServer

__all__ = [
    "ADMIN_PROTOCOL_VERSION",
    "DEFAULT_ADMIN_SOCKET",
    "AdminOps",
    "AdminRefused",
    "AdminServer",
    "AdminUnreachable",
    "OpRefused",
    "Peer",
    "PolicyWatch",
    "ask",
]
