"""`gpuslice-sim --scheduler kube --chaos` (sim/chaos.py): the flag's grammar, what a run needs for
each kill (said before any replay), the monkey killing its target once a run's creates pass the
fraction, recording what and when, and a run kept going while a killed leader's requeues wait in
its journal. The kills in a real replay: tests/e2e/test_real_replay.py."""

from __future__ import annotations

import argparse
import asyncio
import pathlib
import subprocess
from typing import Any

import pytest

from gpuslice.sim import chaos, controlplane, kube_replay, main


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("kill-webhook-replica@0.5", chaos.Event("kill-webhook-replica", 0.5)),
        ("kill-controller-leader@1", chaos.Event("kill-controller-leader", 1.0)),
        ("kill-webhook-replica@0.01", chaos.Event("kill-webhook-replica", 0.01)),
        ("kill-scheduler@0.5", chaos.Event("kill-scheduler", 0.5)),
    ],
)
def test_an_action_at_a_fraction_of_the_arrivals(text: str, expected: chaos.Event) -> None:
    assert chaos.parse(text) == expected
    assert chaos.parse(str(expected)) == expected


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("kill-webhook@0.5", "ACTION one of kill-webhook-replica, kill-controller-leader"),
        ("kill-webhook-replica", "expected ACTION@FRACTION"),
        ("kill-webhook-replica@0", "must be in (0, 1], got '0'"),
        ("kill-webhook-replica@1.5", "must be in (0, 1]"),
        ("kill-webhook-replica@half", "must be in (0, 1], got 'half'"),
        ("kill-webhook-replica@nan", "must be in (0, 1]"),
    ],
)
def test_a_bad_chaos_flag_says_what_is_expected(text: str, says: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError) as error:
        chaos.parse(text)
    assert says in str(error.value)


@pytest.mark.parametrize(
    ("events", "replicas", "controller", "dra", "says"),
    [
        (["kill-webhook-replica@0.5"], 1, True, False, "needs --webhook-replicas 2 or more"),
        (["kill-controller-leader@0.5"], 2, False, False, "needs the controller"),
        (["kill-controller-leader@0.5"], 2, True, True, "device-plugin mode only"),
        (["kill-webhook-replica@0.2", "kill-webhook-replica@0.8"], 3, True, False, "given more than once"),
    ],
    ids=["one-replica", "no-controller", "dra", "twice"],
)
def test_a_run_that_cannot_carry_out_a_kill_is_refused(
    events: list[str], replicas: int, controller: bool, dra: bool, says: str
) -> None:
    with pytest.raises(ValueError, match=says):
        chaos.check([chaos.parse(e) for e in events], webhook_replicas=replicas, controller=controller, dra=dra)


def test_both_kills_fit_a_run_with_two_replicas_and_the_controller() -> None:
    events = [chaos.parse("kill-webhook-replica@0.5"), chaos.parse("kill-controller-leader@0.3")]
    chaos.check(events, webhook_replicas=2, controller=True, dra=False)
    assert chaos.needs_standby(events) and not chaos.needs_standby(events[:1])


def test_the_command_line_refuses_a_replica_kill_without_replicas_before_any_replay(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for binary in controlplane.BINARIES:  # present, never run: the check comes first
        (tmp_path / binary).write_text("")
        (tmp_path / binary).chmod(0o755)
    argv = ["--scheduler", "kube", "--kube-bin", str(tmp_path), "--chaos", "kill-webhook-replica@0.5"]
    assert main.main(argv) == 2
    assert "gpuslice-sim: --chaos kill-webhook-replica needs --webhook-replicas 2" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main.main(["--scheduler", "kube", "--chaos", "kill-everything@0.5"])
    assert "argument --chaos: 'kill-everything@0.5'" in capsys.readouterr().err


class _Plane:
    """What the monkey asks of a control plane: to reap a process it killed."""

    def __init__(self) -> None:
        self.stopped: list[Any] = []

    def stop_process(self, process: Any) -> None:
        process.popen.wait(10)
        self.stopped.append(process)


class _Process:
    def __init__(self) -> None:
        self.popen = subprocess.Popen(["sleep", "60"], start_new_session=True)  # noqa: S607 - coreutils


async def test_the_monkey_kills_one_replica_and_the_leader_once_the_creates_pass_their_fractions() -> None:
    webhooks = [chaos.Target(f"webhook-{i}", _Process(), 1000 + i) for i in range(2)]
    leader, standby = chaos.Target("controller", _Process(), 2000), chaos.Target("controller-standby", _Process(), 2001)
    processes = [t.process for t in [*webhooks, leader, standby]]
    try:
        created = 0
        killed_leader = False

        def leading(port: int) -> bool:  # the standby takes over once the leader is gone
            return port == (standby.port if killed_leader else leader.port)

        plane = _Plane()
        monkey = chaos.Monkey([chaos.parse("kill-controller-leader@0.6"), chaos.parse("kill-webhook-replica@0.25")])
        monkey.arm(plane, webhooks=webhooks, controllers=[leader, standby], leading=leading)  # type: ignore[arg-type]
        loop = asyncio.get_running_loop()
        run = asyncio.create_task(monkey.run(100, lambda: created, loop.time()))
        for created in range(1, 101):
            await asyncio.sleep(0.01)
            if plane.stopped and plane.stopped[-1] is leader.process:
                killed_leader = True
            if created == 24:  # one short of a quarter: nothing killed yet
                assert plane.stopped == []
        await asyncio.wait_for(run, 10)
    finally:
        for process in processes:
            process.popen.kill()
            process.popen.wait()
    assert plane.stopped == [webhooks[0].process, leader.process]
    first, second = monkey.records
    assert first["event"] == "kill-webhook-replica@0.25" and first["killed"] == "webhook-0"
    assert 25 <= first["after_creates"] < 60
    assert second["event"] == "kill-controller-leader@0.6" and second["killed"] == "controller"
    assert second["after_creates"] >= 60 and second["standby_leading_after_s"] is not None
    assert webhooks[0].process.popen.returncode == -9  # SIGKILL, not a clean stop


async def test_the_monkey_kills_the_scheduler_running_at_that_moment() -> None:
    # A restart replaces the process (sim/keeper.py): the monkey asks which one runs when it kills.
    running = [chaos.Target("kube-scheduler", _Process())]
    first = running[0].process
    running.insert(0, chaos.Target("kube-scheduler", _Process()))  # the first one was replaced
    try:
        plane = _Plane()
        monkey = chaos.Monkey([chaos.parse("kill-scheduler@0.5")], scheduler=lambda: running[0])
        monkey.arm(plane)  # type: ignore[arg-type]
        await asyncio.wait_for(monkey.run(10, lambda: 5, 0.0), 10)
    finally:
        for target in running:
            target.process.popen.kill()
            target.process.popen.wait()
    assert plane.stopped == [running[0].process] and first not in plane.stopped
    [record] = monkey.records
    assert (record["event"], record["killed"], record["after_creates"]) == ("kill-scheduler@0.5", "kube-scheduler", 5)


async def test_a_kill_with_nothing_of_its_kind_to_kill_is_recorded_as_such() -> None:
    monkey = chaos.Monkey([chaos.parse("kill-webhook-replica@0.5")])  # never armed: a whole-GPU run
    await asyncio.wait_for(monkey.run(10, lambda: 10, 0.0), 5)
    assert monkey.records == [{"event": "kill-webhook-replica@0.5", "after_creates": 10, "killed": None}]


class _Journal:
    """What the replay asks of the API server after a leader's kill: the journal's ConfigMaps."""

    def __init__(self, entries: int) -> None:
        self.entries = entries
        self.asked: list[tuple[str, str, dict[str, str]]] = []

    async def request(self, method: str, path: str, *, params: dict[str, str]) -> dict[str, Any]:
        self.asked.append((method, path, params))
        return {"items": [{}] * self.entries}


async def test_a_run_is_not_over_while_a_killed_leaders_requeues_wait_in_its_journal() -> None:
    monkey = chaos.Monkey([chaos.parse("kill-controller-leader@0.5")])
    label = "gpuslice.io/requeue-journal"
    left = kube_replay._leader_work_left
    assert not await left(_Journal(1), monkey, label)  # type: ignore[arg-type]  # no leader killed: not asked
    monkey.leaders_killed = 1
    api = _Journal(2)
    assert await left(api, monkey, label)  # type: ignore[arg-type]
    assert api.asked == [("GET", "/api/v1/namespaces/default/configmaps", {"labelSelector": label})]
    assert not await left(_Journal(0), monkey, label)  # type: ignore[arg-type]  # the successor finished them
