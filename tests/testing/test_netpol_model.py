"""The e2e model's truth tables (flock.testing.netpol)."""

from __future__ import annotations

from flock.testing.netpol import MODEL, Peer, Reachability


def result(src: str, dst: str, connected: bool, port: str = "80/TCP", family: int = 6) -> dict[str, object]:
    return {"from": src, "to": dst, "port": port, "family": family, "connected": connected}


def test_model_and_expectations() -> None:
    assert MODEL.pods == ("x/a", "x/b", "x/c", "y/a", "y/b", "y/c", "z/a", "z/b", "z/c")
    assert MODEL.port_args()[:2] == ["serve-80-tcp=80/TCP", "serve-80-udp=80/UDP"]
    want = Reachability(MODEL.pods, True)
    want.expect_peer(Peer(), Peer("x"), False)
    want.expect("y/a", "x/b", True)
    want.expect_all_egress("z/c", False)
    assert not want.expected("x/a", "x/b") and want.expected("y/a", "x/b") and want.expected("x/a", "x/a")
    assert not want.expected("z/c", "y/a") and want.expected("z/c", "z/c")  # itself: always
    results = [result(s, d, want.expected(s, d)) for s in MODEL.pods for d in MODEL.pods]
    assert want.mismatches(results, "80/TCP", 6) == []
    assert len(want.mismatches(results, "81/TCP", 6)) == 81  # nothing probed on that port


def test_mismatches_and_table_point_at_the_difference() -> None:
    want = Reachability(("x/a", "x/b"), True)
    want.expect_all_ingress("x/b", False)
    results = [result("x/a", "x/a", True), result("x/a", "x/b", True), result("x/b", "x/a", True)]
    assert want.mismatches(results, "80/TCP", 6) == [
        "x/a → x/b 80/TCP IPv6: expected blocked",
        "x/b → x/b 80/TCP IPv6: not probed",
    ]
    rows = want.table(results, "80/TCP", 6).splitlines()
    assert rows[0] == "80/TCP IPv6: expected | observed"
    assert rows[2].split() == ["x/a", ".", "X", "|", ".", "!."]
    assert rows[3].split() == ["x/b", ".", ".", "|", ".", "?"]
