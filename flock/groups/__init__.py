"""Address groups on the wire (issue 35): what flock-controller writes and agents read.

- :mod:`._wire`: AddressGroup (one slice of one group's members) and NodeAddressGroups (the groups a
  node needs) as objects, encoded and decoded with every field checked;
- :mod:`._slices`: :class:`SliceBook`, which slice holds which member and which objects a pass writes.

What a group is and which nodes need it is :mod:`flock.policy._groups` (pure, the policy compiler's
own selection); the controller's loop is :mod:`flock.controller._groups`; the agent's side is
:mod:`flock.watchers._groups`.
"""

from ._slices import SliceBook, Write
from ._wire import (
    ADDRESS_GROUPS,
    API_VERSION,
    GROUP_LABEL,
    MAX_MEMBERS,
    NODE_GROUPS,
    address_group,
    decode_member,
    decode_members,
    decode_node_groups,
    encode_member,
    node_address_groups,
    slice_index,
    slice_name,
)

__all__ = [
    "ADDRESS_GROUPS",
    "API_VERSION",
    "GROUP_LABEL",
    "MAX_MEMBERS",
    "NODE_GROUPS",
    "SliceBook",
    "Write",
    "address_group",
    "decode_member",
    "decode_members",
    "decode_node_groups",
    "encode_member",
    "node_address_groups",
    "slice_index",
    "slice_name",
]
