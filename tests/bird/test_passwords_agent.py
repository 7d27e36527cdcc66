"""BGP passwords end to end through the real flock-agent: the fake API server serves
the Secret over HTTP, the agent renders it into BIRD's 0600 include file, and the
value appears nowhere else (agent log, BIRD log, /metrics, /readyz)."""

from __future__ import annotations

import stat

from flock.apiserver import NODECONFIGS, SECRETS, secret_object
from flock.testing.agentlab import NODE, open_lab, wait_for

AGENT_NS = "flock-system"
FIRST, SECOND = "md5-first-Secret!", "md5-second-Secret?"


def test_password_from_a_secret_reaches_bird_and_nothing_else(require_root, require_bird, tmp_path) -> None:
    with open_lab(tmp_path, "fl-md5-") as lab:
        lab.api.create(SECRETS, secret_object(AGENT_NS, "bgp-tor", {"tor1": FIRST}))
        # A Secret of that name in another namespace is never read.
        lab.api.create(SECRETS, secret_object("default", "bgp-tor", {"tor1": "not-this-one"}))
        peer = {
            "name": "tor1",
            "address": "2001:db8:ffff::1",
            "asn": 64500,
            "password": {"secretKeyRef": {"name": "bgp-tor", "key": "tor1"}},
        }
        lab.api.patch(NODECONFIGS, NODE, {"spec": {"bgp": {"peers": [peer]}}})
        agent = lab.agent(POD_NAMESPACE=AGENT_NS)
        agent.wait_ready()
        secrets = lab.bird_config.parent / "bird-secrets.conf"

        def holds(value: str) -> bool:
            return secrets.exists() and value in secrets.read_text()

        wait_for("the password in BIRD's secrets file", lambda: holds(FIRST))
        assert stat.S_IMODE(secrets.stat().st_mode) == 0o600
        conf = lab.bird_config.read_text()
        assert "password flock_password_0;" in conf and FIRST not in conf and "disabled;" not in conf
        # BIRD took it: the session exists and is not administratively down.
        wait_for("BIRD running bgp_tor1", lambda: "bgp_tor1" in lab.birdc("show", "protocols"))

        # Rotation: the new value replaces the old one.
        lab.api.patch(SECRETS, "bgp-tor", {"stringData": {"tor1": SECOND}}, AGENT_NS)
        wait_for("the rotated password", lambda: holds(SECOND) and not holds(FIRST))

        # The key removed: the peer is kept down (never unauthenticated), and /readyz says why.
        lab.api.patch(SECRETS, "bgp-tor", {"data": {"tor1": None}}, AGENT_NS)
        wait_for("the peer disabled", lambda: "disabled;" in lab.bird_config.read_text())
        wait_for(
            "/readyz naming the missing key",
            lambda: f"Secret {AGENT_NS}/bgp-tor has no key 'tor1'" in agent.get("/readyz")[1],
        )
        status, readyz = agent.get("/readyz")
        assert status == 200 and "BGP peer tor1 is kept down" in readyz
        wait_for("the password file gone", lambda: not secrets.exists())
        metrics = agent.get("/metrics")[1]
        assert 'flock_bgp_password_missing{peer="tor1"} 1' in metrics

        logs = agent.log.read_text() + (tmp_path / "bird.log").read_text()
        for value in (FIRST, SECOND):
            for where, text in (("agent/bird log", logs), ("/metrics", metrics), ("/readyz", readyz)):
                assert value not in text, f"the password leaked into {where}"
