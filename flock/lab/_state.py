"""``lab.json``: what a lab is made of, so every command (and a later ``up``
cleaning a crashed lab) finds it from the lab directory alone."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import attrs

from flock.lab._plan import DEFAULT_MTU, LabPlan
from flock.lab._procs import ProcRef, is_running

STATE_FILE = "lab.json"
PROCS_FILE = "procs.json"


class LabError(RuntimeError):
    """A lab command that cannot do what was asked; the message says why and what to do."""


@attrs.frozen
class LabState:
    plan: LabPlan
    dir_created: bool  # the lab made its directory (down removes it)
    keeper: ProcRef | None = None
    phase: str = "starting"  # starting → up
    image: dict[str, Any] | None = None  # the image lab's settings (flock.lab._image.ImageSettings)

    def to_json(self) -> dict[str, Any]:
        return {
            "version": 1,
            "dir": str(self.plan.dir),
            "id": self.plan.id,
            "nodes": [n.name for n in self.plan.nodes],
            "namespaces": self.plan.namespaces,
            "uplink_mtu": self.plan.uplink_mtu,
            "internet": self.plan.internet,
            "fabric_bfd": self.plan.fabric_bfd,
            "encrypt": self.plan.encrypt,
            "dir_created": self.dir_created,
            "keeper": None if self.keeper is None else attrs.asdict(self.keeper),
            "phase": self.phase,
            "apiserver": self.plan.apiserver_url,
            "image": self.image,
        }

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> LabState:
        plan = LabPlan.make(
            Path(obj["dir"]),
            len(obj["nodes"]),
            uplink_mtu=obj.get("uplink_mtu", DEFAULT_MTU),
            internet=bool(obj.get("internet")),
            fabric_bfd=obj.get("fabric_bfd", "mixed"),
            encrypt=bool(obj.get("encrypt")),
        )
        keeper = obj.get("keeper")
        return cls(
            plan,
            bool(obj.get("dir_created")),
            None if keeper is None else ProcRef(**keeper),
            obj.get("phase", "starting"),
            obj.get("image"),
        )

    def save(self) -> None:
        path = self.plan.dir / STATE_FILE
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(self.to_json(), indent=2) + "\n")
        os.replace(tmp, path)


def load_state(directory: Path) -> LabState | None:
    try:
        return LabState.from_json(json.loads((directory / STATE_FILE).read_text()))
    except FileNotFoundError:
        return None


def require_state(directory: Path) -> LabState:
    state = load_state(directory)
    if state is None:
        raise LabError(f"no lab in {directory} (no {STATE_FILE}): run `flock-lab up` first, or pass --dir")
    return state


def load_procs(directory: Path) -> dict[str, Any]:
    """The keeper's status file (see :mod:`flock.lab.keeper`); empty when absent."""
    try:
        return json.loads((directory / PROCS_FILE).read_text())
    except (FileNotFoundError, ValueError):
        return {}


def process_refs(directory: Path) -> dict[str, ProcRef]:
    procs = load_procs(directory).get("processes", {})
    return {name: ProcRef(p["pid"], p["start_time"]) for name, p in procs.items() if p.get("start_time")}


def keeper_running(state: LabState) -> bool:
    return state.keeper is not None and is_running(state.keeper)
