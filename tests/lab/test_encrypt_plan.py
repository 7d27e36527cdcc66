"""flock-lab up --encrypt, planned (pure): every agent encrypts, each with a device name of its own."""

from __future__ import annotations

from flock.agent._cli import parse_args
from flock.lab._lifecycle import agent_argv
from flock.lab._plan import LabPlan
from flock.lab._state import LabState


def test_every_agent_encrypts_with_a_device_of_its_own(tmp_path) -> None:
    plan = LabPlan.make(tmp_path / "lab", 3, encrypt=True)
    devices = [n.wireguard_device for n in plan.nodes]
    assert len(set(devices)) == 3 and all(d is not None and len(d) <= 15 for d in devices)
    for node in plan.nodes:
        argv = agent_argv(node, program=[])
        assert {"--encryption=wireguard", f"--wireguard-device={node.wireguard_device}"} <= set(argv)
        # the flags as flock-agent parses them (its kubeconfig is only made when the lab starts)
        flags = [a for a in argv if a.startswith(("--encryption", "--wireguard", "--node"))]
        settings, _ = parse_args(flags, {})
        assert (settings.encryption, settings.wireguard_device, settings.wireguard_kind) == (
            "wireguard",
            node.wireguard_device,
            "userspace",
        )
    plain = LabPlan.make(tmp_path / "lab", 1)
    assert not any(a.startswith(("--encryption", "--wireguard")) for a in agent_argv(plain.nodes[0], program=[]))
    again = LabState.from_json(LabState(plan, dir_created=True).to_json()).plan
    assert again.encrypt and [n.wireguard_device for n in again.nodes] == devices
