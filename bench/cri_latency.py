"""CRI RunPodSandbox latency: flock versus ptp + host-local under the same containerd, same run.

One node (flock.testing.agentlab: fake API server, node netns, real agent)
with flock installed by flock-install-cni (default conflist), and one
Debian containerd 1.6 in the node's namespace (flock.testing.runtimes).  The
CNI is switched by adding/removing ``00-ptp.conflist`` in containerd's conf
dir (it sorts before ``01-flock.conflist``; containerd reloads on change);
after each switch a probe sandbox must get an address from the expected
plugin before anything is timed.  Phases alternate (flock, ptp, flock, …) so
drift on a shared machine hits both alike.  Timed: the RunPodSandbox call
(the sandbox container, the netns, the CNI ADD, containerd's bookkeeping);
StopPodSandbox + RemovePodSandbox are timed separately.  Pod objects are
created untimed, before the phase's first sandbox.  ms, median and p99.

    python bench/cri_latency.py [--rounds 10] [--phases 3] [--stacks v4,dual]
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

from flock import installer
from flock.apiserver import PODS, pod_object
from flock.testing.agentlab import NODE, open_lab
from flock.testing.benchkit import stats_ms
from flock.testing.runtimes import Containerd

STACKS = {
    "v4": {"flock.fritzlab.net/ipv4": "true", "flock.fritzlab.net/ipv6": "false"},
    "dual": {"flock.fritzlab.net/ipv4": "true"},
}
PTP_V4, PTP_V6 = "203.0.113.0/24", "2001:db8:beef::/64"
FLOCK_NETS = ("2001:db8:0:1::/64", "198.51.100.0/29")


def ptp_conflist(data_dir: Path, dual: bool) -> str:
    ranges = [[{"subnet": PTP_V4}]] + ([[{"subnet": PTP_V6}]] if dual else [])
    return json.dumps(
        {
            "cniVersion": "1.0.0",
            "name": "ptp-bench",
            "plugins": [
                {
                    "type": "ptp",
                    "ipMasq": False,
                    "ipam": {"type": "host-local", "ranges": ranges, "dataDir": str(data_dir)},
                }
            ],
        }
    )


class Bench:
    def __init__(self, lab, ctrd: Containerd, conf_dir: Path, data_dir: Path) -> None:
        self.lab, self.ctrd, self.conf_dir, self.data_dir = lab, ctrd, conf_dir, data_dir
        assert ctrd.cri is not None
        self.cri = ctrd.cri
        self.n = 0

    def pod(self, cni: str, stack: str) -> tuple[str, str]:
        self.n += 1
        name = f"{cni}-{stack}-{self.n}"
        if cni == "flock":
            obj = self.lab.api.create(PODS, pod_object("bench", name, NODE, annotations=STACKS[stack]))
            return name, obj["metadata"]["uid"]
        return name, f"uid-{self.n}"

    def switch(self, cni: str, stack: str) -> None:
        ptp = self.conf_dir / "00-ptp.conflist"
        if cni == "ptp":
            ptp.write_text(ptp_conflist(self.data_dir, stack == "dual"))
        else:
            ptp.unlink(missing_ok=True)
        deadline = time.monotonic() + 30
        while True:  # until containerd has reloaded: a probe sandbox gets the expected plugin's address
            name, uid = self.pod(cni, stack)
            sid = self.cri.run_pod_sandbox(name, "bench", uid)
            ip = ipaddress.ip_address(self.cri.pod_sandbox_status(sid).ips[0])
            self.cri.stop_pod_sandbox(sid)
            self.cri.remove_pod_sandbox(sid)
            from_ptp = any(ip in ipaddress.ip_network(n) for n in (PTP_V4, PTP_V6))
            if from_ptp == (cni == "ptp"):
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"containerd did not switch to {cni} within 30 s")
            time.sleep(0.2)

    def phase(self, cni: str, stack: str, rounds: int, runs: list[float], teardowns: list[float]) -> None:
        self.switch(cni, stack)
        # The Pod objects first, untimed (the kubelet runs a sandbox for a pod already in its informer).
        pods = [self.pod(cni, stack) for _ in range(rounds)]
        for name, uid in pods:
            began = time.perf_counter()
            sid = self.cri.run_pod_sandbox(name, "bench", uid)
            runs.append(time.perf_counter() - began)
            ips = self.cri.pod_sandbox_status(sid).ips
            assert ips and (cni == "ptp") == any(
                ipaddress.ip_address(ips[0]) in ipaddress.ip_network(n) for n in (PTP_V4, PTP_V6)
            ), (cni, ips)
            began = time.perf_counter()
            self.cri.stop_pod_sandbox(sid)
            self.cri.remove_pod_sandbox(sid)
            teardowns.append(time.perf_counter() - began)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=10, help="sandboxes per phase (default %(default)s)")
    ap.add_argument("--phases", type=int, default=3, help="flock/ptp alternations per stack (default %(default)s)")
    ap.add_argument("--stacks", default="v4,dual", help="comma-separated: v4, dual (default %(default)s)")
    args = ap.parse_args()
    stacks = args.stacks.split(",")
    tmp = Path(tempfile.mkdtemp(prefix="fl-cb-"))
    results: dict = {}
    try:
        with open_lab(tmp, "fl-cb-", bird=False) as lab:
            cni_bin, cni_conf = tmp / "cni" / "bin", tmp / "cni" / "net.d"
            installer.install(installer.InstallConfig(bin_dir=cni_bin, conf_dir=cni_conf, socket=str(lab.socket)))
            for plugin in ("ptp", "host-local"):  # containerd 1.6 runs every plugin from its one bin_dir
                shutil.copy2(f"/usr/lib/cni/{plugin}", cni_bin / plugin)
            agent = lab.agent()
            agent.wait_ready()
            ctrd = Containerd(Path(tempfile.mkdtemp(prefix="fl-cbd-")), lab.node.path, cni_bin, cni_conf)
            try:
                ctrd.start()
                assert ctrd.cri is not None
                version = ctrd.cri.version()
                bench = Bench(lab, ctrd, cni_conf, tmp / "host-local")
                for stack in stacks:
                    samples: dict[str, tuple[list[float], list[float]]] = {"flock": ([], []), "ptp": ([], [])}
                    for _ in range(args.phases):
                        for cni in ("flock", "ptp"):
                            bench.phase(cni, stack, args.rounds, *samples[cni])
                    results[stack] = {
                        cni: {"run_pod_sandbox_ms": stats_ms(r), "stop_remove_ms": stats_ms(t)}
                        for cni, (r, t) in samples.items()
                    }
                    print(f"{stack}: {json.dumps(results[stack])}", file=sys.stderr, flush=True)
            finally:
                ctrd.stop()
            agent.stop()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    doc = {
        "bench": "cri_latency",
        "containerd": version[1],
        "rounds": args.rounds,
        "phases": args.phases,
        "results": results,
    }
    print(json.dumps(doc, separators=(",", ":")), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
