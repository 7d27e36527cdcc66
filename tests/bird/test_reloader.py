"""flock.bird.reloader: debounce, skip, retry schedule in virtual time; the real runner."""

from __future__ import annotations

import contextlib
import ipaddress
import itertools
import pathlib
import subprocess
from collections.abc import AsyncIterator, Sequence

import attrs
import pytest
import trio

from flock.bird import (
    SECRETS_FILE,
    BirdInputs,
    BirdReloader,
    ReloadError,
    RenderSettings,
    render,
    render_secrets,
    run_process,
)
from flock.model import NodeConfig

SETTINGS = RenderSettings(route_protocol=252)
NODE = NodeConfig.from_object(
    {
        "metadata": {"name": "host001"},
        "spec": {
            "cidr6": "2001:db8:0:1::/64",
            "bgp": {
                "asn": 64512,
                "routerID": "192.0.2.11",
                "peers": [{"name": "tor1", "address": "2001:db8:ffff::1", "asn": 64500}],
            },
        },
    }
)


@attrs.define(eq=False)
class RecordingRunner:
    """Stands in for bird/birdc: records (virtual time, argv) and answers from a script.

    ``failures[tool]`` is how many of the next calls to ``tool`` exit 1;
    ``hangs[tool]`` how many never finish (a wedged BIRD).
    """

    failures: dict[str, int] = attrs.field(factory=dict)
    hangs: dict[str, int] = attrs.field(factory=dict)
    calls: list[tuple[float, list[str]]] = attrs.field(factory=list)

    async def __call__(self, argv: Sequence[str]) -> subprocess.CompletedProcess:
        self.calls.append((round(trio.current_time(), 6), list(argv)))
        tool = pathlib.Path(argv[0]).name
        if self.hangs.get(tool, 0) > 0:
            self.hangs[tool] -= 1
            await trio.sleep_forever()
        if self.failures.get(tool, 0) > 0:
            self.failures[tool] -= 1
            return subprocess.CompletedProcess(argv, 1, b"", b"Unable to connect to server control socket\n")
        out = b"Reconfigured\n" if tool == "birdc" else b""
        return subprocess.CompletedProcess(argv, 0, out, b"")

    def times(self, tool: str) -> list[float]:
        return [t for t, argv in self.calls if argv[0] == tool]


@attrs.define(eq=False)
class World:
    """The reloader's inputs, changed by the test as the agent's caches would be."""

    inputs: BirdInputs | None = BirdInputs(NODE)

    def __call__(self) -> BirdInputs | None:
        return self.inputs


@contextlib.asynccontextmanager
async def serving(reloader: BirdReloader) -> AsyncIterator[None]:
    """The reloader runs (and has made its start-up poke) inside the block, and stops after it."""
    async with trio.open_nursery() as nursery:
        await nursery.start(reloader.run)
        yield
        nursery.cancel_scope.cancel()


def make(tmp_path: pathlib.Path, runner: RecordingRunner, world: World | None = None) -> BirdReloader:
    return BirdReloader(
        config_path=tmp_path / "bird.conf",
        control_socket=tmp_path / "bird.ctl",
        settings=SETTINGS,
        inputs=world or World(),
        runner=runner,
    )


async def serve_quietly(
    tmp_path: pathlib.Path, runner: RecordingRunner, seconds: float, world: World | None = None
) -> BirdReloader:
    """A reloader that gets only its start-up poke, run for ``seconds`` of virtual time."""
    reloader = make(tmp_path, runner, world)
    with trio.fail_after(seconds + 60):
        async with serving(reloader):
            await trio.sleep(seconds)
    return reloader


async def test_five_pokes_100ms_apart_reload_once_at_0_9(autojump_clock, tmp_path: pathlib.Path) -> None:
    runner = RecordingRunner()
    reloader = make(tmp_path, runner)
    with trio.fail_after(60):
        async with serving(reloader):  # its own start-up poke joins the burst at t=0
            for _ in range(5):
                reloader.poke()
                await trio.sleep(0.1)
            await trio.sleep(10)
    check, configure = runner.calls
    assert check[0] == 0.9 and check[1][:3] == ["bird", "-p", "-c"]
    assert configure == (0.9, ["birdc", "-s", str(tmp_path / "bird.ctl"), "configure"])
    assert (tmp_path / "bird.conf").read_text() == render(NODE, settings=SETTINGS)
    assert reloader.reloads == 1 and reloader.failures == 0


async def test_config_is_checked_in_a_temp_file_beside_it_then_renamed(autojump_clock, tmp_path: pathlib.Path) -> None:
    seen: list[tuple[str, bool]] = []
    runner = RecordingRunner()

    async def checking_runner(argv: Sequence[str]) -> subprocess.CompletedProcess:
        if argv[0] == "bird":
            tmp = pathlib.Path(argv[3])
            # Virtual time: files are read on the Trio thread (a worker thread would let the clock jump).
            seen.append((tmp.read_text(), tmp.parent == tmp_path and not (tmp_path / "bird.conf").exists()))  # noqa: ASYNC240
        return await runner(argv)

    reloader = attrs.evolve(make(tmp_path, runner), runner=checking_runner)
    with trio.fail_after(60):
        assert await reloader.reconcile() is True
    assert seen == [(render(NODE, settings=SETTINGS), True)]
    assert [p.name for p in tmp_path.iterdir()] == ["bird.conf"]  # noqa: ASYNC240  virtual time (see above)
    assert (tmp_path / "bird.conf").stat().st_mode & 0o777 == 0o644


async def test_start_removes_temp_files_a_killed_predecessor_left(autojump_clock, tmp_path: pathlib.Path) -> None:
    (tmp_path / ".bird.conf.k2j3h4.tmp").write_text("half a config")
    (tmp_path / "other.tmp").write_text("not ours")
    await serve_quietly(tmp_path, RecordingRunner(), 0)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["other.tmp"]  # noqa: ASYNC240  virtual time


async def test_identical_render_calls_nothing(autojump_clock, tmp_path: pathlib.Path) -> None:
    runner = RecordingRunner()
    reloader = make(tmp_path, runner)
    with trio.fail_after(60):
        async with serving(reloader):
            await trio.sleep(2)
            assert [t for t, _ in runner.calls] == [0.5, 0.5]
            reloader.poke()
            await trio.sleep(10)
    assert len(runner.calls) == 2 and reloader.reloads == 1


async def test_fresh_reloader_with_identical_file_configures_without_rewriting(
    autojump_clock, tmp_path: pathlib.Path
) -> None:
    # A predecessor may have written the file and died before `birdc configure`.
    (tmp_path / "bird.conf").write_text(render(NODE, settings=SETTINGS))
    mtime = (tmp_path / "bird.conf").stat().st_mtime_ns
    runner = RecordingRunner()
    reloader = make(tmp_path, runner)
    with trio.fail_after(60):
        assert await reloader.reconcile() is True
        assert await reloader.reconcile() is False
    assert [argv[0] for _, argv in runner.calls] == ["birdc"]
    assert (tmp_path / "bird.conf").stat().st_mtime_ns == mtime


async def test_bird_down_retries_on_the_backoff_schedule(autojump_clock, tmp_path: pathlib.Path) -> None:
    runner = RecordingRunner(failures={"birdc": 3})
    reloader = await serve_quietly(tmp_path, runner, 30)
    # 0.5 debounce, then 1, 2, 4 s between attempts; the file is checked and written once.
    assert runner.times("birdc") == [0.5, 1.5, 3.5, 7.5]
    assert runner.times("bird") == [0.5]
    assert reloader.reloads == 1 and reloader.failures == 3


async def test_rejected_config_is_never_installed_and_is_retried(autojump_clock, tmp_path: pathlib.Path) -> None:
    (tmp_path / "bird.conf").write_text("# the config BIRD runs now\n")
    runner = RecordingRunner(failures={"bird": 2})
    reloader = make(tmp_path, runner)
    with trio.fail_after(60):
        async with serving(reloader):
            await trio.sleep(1)
            assert (tmp_path / "bird.conf").read_text() == "# the config BIRD runs now\n"
            assert [p.name for p in tmp_path.iterdir()] == ["bird.conf"]  # noqa: ASYNC240  virtual time
            await trio.sleep(30)
    assert runner.times("bird") == [0.5, 1.5, 3.5]
    assert runner.times("birdc") == [3.5]
    assert (tmp_path / "bird.conf").read_text() == render(NODE, settings=SETTINGS)


async def test_wedged_birdc_is_abandoned_at_the_deadline_and_retried(autojump_clock, tmp_path: pathlib.Path) -> None:
    runner = RecordingRunner(hangs={"birdc": 1})
    reloader = await serve_quietly(tmp_path, runner, 30)
    # Started at 0.5, abandoned at 10.5 (command_deadline), retried 1 s later.
    assert runner.times("birdc") == [0.5, 11.5]
    assert reloader.reloads == 1 and reloader.failures == 1


async def test_backoff_is_capped(autojump_clock, tmp_path: pathlib.Path) -> None:
    runner = RecordingRunner(failures={"birdc": 8})
    await serve_quietly(tmp_path, runner, 300)
    gaps = [round(b - a, 6) for a, b in itertools.pairwise(runner.times("birdc"))]
    assert gaps == [1, 2, 4, 8, 16, 30, 30, 30]


async def test_retry_renders_the_latest_inputs(autojump_clock, tmp_path: pathlib.Path) -> None:
    world = World()
    runner = RecordingRunner(failures={"birdc": 1})
    reloader = make(tmp_path, runner, world)
    anycast = ipaddress.ip_address("2001:db8:aaaa::1")
    with trio.fail_after(60):
        async with serving(reloader):
            await trio.sleep(1)  # first attempt failed at 0.5; retry due at 1.5
            world.inputs = BirdInputs(NODE, anycast={anycast})
            reloader.poke()
            await trio.sleep(10)
    assert runner.times("bird") == [0.5, 1.5] and runner.times("birdc") == [0.5, 1.5]
    assert "2001:db8:aaaa::1/128" in (tmp_path / "bird.conf").read_text()


async def test_endless_pokes_still_reload_after_max_delay(autojump_clock, tmp_path: pathlib.Path) -> None:
    world = World()
    runner = RecordingRunner()
    reloader = make(tmp_path, runner, world)
    with trio.fail_after(60):
        async with serving(reloader):
            for i in range(71):  # t = 0.0 … 7.0, a pod with a new anycast address every 100 ms
                world.inputs = BirdInputs(NODE, anycast={ipaddress.IPv6Address(f"2001:db8:aaaa::{i + 1:x}")})
                reloader.poke()
                await trio.sleep(0.1)
            await trio.sleep(10)
    assert runner.times("birdc") == [5.0, 7.5]


async def test_nothing_to_render_yet_calls_nothing(autojump_clock, tmp_path: pathlib.Path) -> None:
    world = World(inputs=None)
    runner = RecordingRunner()
    reloader = make(tmp_path, runner, world)
    with trio.fail_after(60):
        async with serving(reloader):
            await trio.sleep(5)
            world.inputs = BirdInputs(NODE)
            reloader.poke()
            await trio.sleep(5)
    assert runner.times("birdc") == [5.5]


async def test_unrenderable_inputs_are_logged_not_retried(autojump_clock, tmp_path: pathlib.Path, caplog) -> None:
    world = World(inputs=BirdInputs(attrs.evolve(NODE, name="bad\nname")))
    runner = RecordingRunner()
    await serve_quietly(tmp_path, runner, 30, world)
    assert runner.calls == [] and not (tmp_path / "bird.conf").exists()
    assert [r.field for r in caplog.records if r.name == "flock.bird"] == ["node.name"]


async def test_real_runner_checks_with_bird_and_reports_bird_down(require_bird: None, tmp_path: pathlib.Path) -> None:
    reloader = BirdReloader(tmp_path / "bird.conf", tmp_path / "bird.ctl", SETTINGS, World(), run_process)
    with trio.fail_after(20):
        with pytest.raises(ReloadError) as info:
            await reloader.reconcile()
    # bird -p accepted the render (the file is in place); birdc found no BIRD behind the socket.
    assert info.value.step == "configure" and info.value.returncode != 0
    assert "bird.ctl" in info.value.output
    assert (tmp_path / "bird.conf").read_text() == render(NODE, settings=SETTINGS)


async def test_a_missing_birdc_binary_is_retried_and_reported_until_it_works(
    autojump_clock, tmp_path: pathlib.Path
) -> None:
    runner = RecordingRunner()
    missing = {"left": 2}

    async def not_installed_yet(argv: Sequence[str]) -> subprocess.CompletedProcess:
        if argv[0] == "birdc" and missing["left"] > 0:
            missing["left"] -= 1
            raise FileNotFoundError(2, "No such file or directory")
        return await runner(argv)

    reloader = make(tmp_path, runner)
    reloader.runner = not_installed_yet
    with trio.fail_after(60):
        async with serving(reloader):
            await trio.sleep(1)
            assert (
                reloader.last_error
                == "configure: birdc -s {} configure exited 127: cannot run birdc: No such file or directory".format(
                    tmp_path / "bird.ctl"
                )
            )
            await trio.sleep(10)
    # 0.5 debounce, then 1 and 2 s of backoff: the third attempt finds birdc.
    assert runner.times("birdc") == [3.5]
    assert reloader.reloads == 1 and reloader.failures == 2 and reloader.last_error is None


SECRET = "md5-s3cret-value"
NODE_MD5 = NodeConfig.from_object(
    {
        "metadata": {"name": "host001"},
        "spec": {
            "cidr6": "2001:db8:0:1::/64",
            "bgp": {
                "asn": 64512,
                "routerID": "192.0.2.11",
                "peers": [
                    {
                        "name": "tor1",
                        "address": "2001:db8:ffff::1",
                        "asn": 64500,
                        "password": {"secretKeyRef": {"name": "bgp", "key": "tor1"}},
                    }
                ],
            },
        },
    }
)


async def test_password_is_checked_with_the_config_and_written_0600(
    autojump_clock, tmp_path: pathlib.Path, caplog
) -> None:
    seen: list[tuple[str, str, int]] = []
    runner = RecordingRunner()

    async def checking_runner(argv: Sequence[str]) -> subprocess.CompletedProcess:
        if argv[0] == "bird":
            conf = pathlib.Path(argv[3])
            secrets = conf.parent / SECRETS_FILE
            seen.append((conf.parent.parent.name, secrets.read_text(), secrets.stat().st_mode & 0o777))
        return await runner(argv)

    world = World(BirdInputs(NODE_MD5, passwords={"tor1": SECRET}))
    reloader = attrs.evolve(make(tmp_path, runner, world), runner=checking_runner)
    with trio.fail_after(60):
        assert await reloader.reconcile() is True
    # Checked in a private directory beside the config, the secrets file beside it already 0600.
    assert seen == [(tmp_path.name, render_secrets(NODE_MD5, {"tor1": SECRET}), 0o600)]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bird-secrets.conf", "bird.conf"]  # noqa: ASYNC240  virtual time
    assert (tmp_path / SECRETS_FILE).stat().st_mode & 0o777 == 0o600
    assert SECRET in (tmp_path / SECRETS_FILE).read_text() and SECRET not in (tmp_path / "bird.conf").read_text()
    assert SECRET not in repr(world.inputs) and SECRET not in caplog.text

    # The password goes away with the peer that used it.
    world.inputs = BirdInputs(NODE)
    with trio.fail_after(60):
        assert await reloader.reconcile() is True
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bird.conf"]  # noqa: ASYNC240  virtual time


async def test_a_password_bird_echoes_is_never_logged_or_kept(autojump_clock, tmp_path: pathlib.Path, caplog) -> None:
    async def echoing_runner(argv: Sequence[str]) -> subprocess.CompletedProcess:
        secrets = pathlib.Path(argv[-1]).parent / SECRETS_FILE if argv[0] == "bird" else None
        text = secrets.read_text() if secrets is not None and secrets.exists() else ""
        return subprocess.CompletedProcess(argv, 1, b"", f"parse error near {text}".encode())

    world = World(BirdInputs(NODE_MD5, passwords={"tor1": SECRET}))
    reloader = attrs.evolve(make(tmp_path, RecordingRunner(), world), runner=echoing_runner)
    with trio.fail_after(60):
        async with serving(reloader):
            await trio.sleep(5)
    assert reloader.failures >= 2 and reloader.last_error is not None and "<hidden>" in reloader.last_error
    assert SECRET not in reloader.last_error and SECRET not in caplog.text
    # Rejected: neither file was installed, and the check directory is gone.
    assert list(tmp_path.iterdir()) == []  # noqa: ASYNC240  virtual time


async def test_rejected_config_with_secrets_replaces_neither_working_file(
    require_bird: None, tmp_path: pathlib.Path, monkeypatch
) -> None:
    # The real bird -p: a working pair on disk, then a render BIRD refuses.
    reloader = BirdReloader(
        tmp_path / "bird.conf",
        tmp_path / "bird.ctl",
        SETTINGS,
        World(BirdInputs(NODE_MD5, passwords={"tor1": SECRET})),
        run_process,
    )
    with trio.fail_after(20), pytest.raises(ReloadError) as info:
        await reloader.reconcile()
    assert info.value.step == "configure"  # bird -p accepted it; no BIRD runs behind the socket
    good = {p.name: await p.read_text() for p in await trio.Path(tmp_path).iterdir()}
    assert set(good) == {"bird.conf", SECRETS_FILE}

    import flock.bird.reloader as reloader_module

    real_render = reloader_module.render
    monkeypatch.setattr(reloader_module, "render", lambda *a, **kw: real_render(*a, **kw) + "protocol bogus {}\n")
    reloader.inputs = World(BirdInputs(NODE_MD5, passwords={"tor1": "another-secret"}))
    with trio.fail_after(20), pytest.raises(ReloadError) as info:
        await reloader.reconcile()
    assert info.value.step == "check" and "bird.conf" in info.value.output
    assert {p.name: await p.read_text() for p in await trio.Path(tmp_path).iterdir()} == good
