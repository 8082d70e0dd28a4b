"""The daemon's threads on one CPU (`cpu_affinity`, sessiond_daemon/cpu.py): a real daemon
process and its threads' masks in /proc, its executors' masks, and `auto`'s rule."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import textwrap
from typing import Any

import anyio
import pytest
from conftest import wait_for_daemon

from sessiond import AsyncClient
from sessiond_daemon.cpu import move_to, shares

pytestmark = [pytest.mark.anyio,
              pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux only")]

ALLOWED = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
several = pytest.mark.skipif(len(ALLOWED) < 2, reason="this process may use one CPU only")


def masks(pid: int) -> dict[int, list[int]]:
    """Each thread of `pid` and the CPUs it may run on."""
    found = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(ProcessLookupError):  # it ended meanwhile
            found[int(tid)] = sorted(os.sched_getaffinity(int(tid)))
    return found


def start(short_dir: str, *flags: str) -> tuple[str, subprocess.Popen[bytes]]:
    sock = os.path.join(short_dir, "c.sock")
    proc = subprocess.Popen(
        [sys.executable, "-m", "sessiond_daemon", "--socket", sock, "--db",
         os.path.join(short_dir, "c.db"), "--log-level", "error", *flags],
        stderr=subprocess.PIPE)
    return sock, proc


def stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    proc.communicate(timeout=30)


@several
async def test_the_daemons_threads_share_one_cpu_and_its_executors_get_them_all(
        short_dir: str) -> None:
    sock, proc = start(short_dir)
    try:
        wait_for_daemon(sock, proc)
        threads = masks(proc.pid)
        assert len(threads) >= 2  # the loop's and the SQLite writer's at least
        assert len({tuple(m) for m in threads.values()}) == 1, threads
        (cpu,) = threads[proc.pid]
        assert cpu in ALLOWED
        # A turn's process gets every CPU the daemon was given, not the daemon's one.
        async with AsyncClient(sock) as client:
            await client.spawn([sys.executable, "-c", "import os, json;"
                                " print(json.dumps(sorted(os.sched_getaffinity(0))))"],
                               session_id="mask")
            with anyio.fail_after(30):  # a guard against a hang
                while not (lines := (await client.output("mask")).lines):
                    await anyio.sleep(0.05)
            assert json.loads(lines[0]) == ALLOWED
        # The spawn's widening of the loop's thread was for the spawn only (`auto` may have
        # moved since: the threads share one CPU, whichever).
        after = masks(proc.pid)
        assert len({tuple(m) for m in after.values()}) == 1 and len(after[proc.pid]) == 1
    finally:
        stop(proc)


@several
async def test_off_leaves_every_thread_to_the_scheduler(short_dir: str) -> None:
    sock, proc = start(short_dir, "--cpu-affinity", "off")
    try:
        wait_for_daemon(sock, proc)
        assert set(map(tuple, masks(proc.pid).values())) == {tuple(ALLOWED)}
    finally:
        stop(proc)


async def test_a_number_pins_to_that_cpu_and_one_not_allowed_stops_the_start(
        short_dir: str) -> None:
    cpu = ALLOWED[-1]
    sock, proc = start(short_dir, "--cpu-affinity", str(cpu))
    try:
        wait_for_daemon(sock, proc)
        threads = masks(proc.pid)
        assert set(map(tuple, threads.values())) == {(cpu,)}, threads
    finally:
        stop(proc)
    refused = max(ALLOWED) + 1
    _, proc = start(short_dir, "--cpu-affinity", str(refused))
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 78
    assert (f"cpu_affinity {refused} is not a CPU this process may use"
            f" ({','.join(map(str, ALLOWED))})") in err.decode()


def in_own_process(body: str, hidden: bool = False) -> Any:
    """Run `body` in a Python process of its own (a Pin pins the process it runs in), with
    `pin`, a started `Pin("auto")`, and `masks()`, every thread's CPUs; return what it
    assigns to `result`. `hidden`: /proc/stat cannot be read (systemd's ProcSubset=pid)."""
    script = textwrap.dedent("""
        import json, os, threading
        from sessiond_daemon import cpu
        stop = threading.Event()
        def masks():
            return sorted({tuple(os.sched_getaffinity(int(t)))
                           for t in os.listdir("/proc/self/task")})
        for _ in range(3):
            threading.Thread(target=stop.wait, daemon=True).start()
        if HIDDEN:
            def hidden():
                raise FileNotFoundError(2, "No such file or directory", "/proc/stat")
            cpu._ticks = hidden
        pin = cpu.Pin()
        pin.start("auto")
    """).replace("HIDDEN", str(hidden)) + textwrap.dedent(body) + "\nprint(json.dumps(result))\n"
    out = subprocess.run([sys.executable, "-c", script], check=True, capture_output=True,
                         timeout=60).stdout
    return json.loads(out.splitlines()[-1])  # after the log lines


@several
def test_a_move_takes_every_thread_those_started_while_it_moves_too() -> None:
    """A thread not yet moved starts another as the move lists the threads: the new one
    took the old mask, and is moved too."""
    first, moved, seen = in_own_process("""
        first = pin.cpu
        started = threading.Event()
        listdir = os.listdir
        def listing(path):
            names = listdir(path)
            if not started.is_set():  # an unmoved thread starts one, after this listing
                threading.Thread(target=lambda: threading.Thread(
                    target=stop.wait, daemon=True).start() or started.set()).start()
                started.wait()
            return names
        os.listdir = listing
        pin._move(max(pin.allowed - {first}), "test")
        os.listdir = listdir
        result = [first, pin.cpu, masks()]
    """)
    assert first != moved and seen == [[moved]]


@several
def test_a_cpu_the_kernel_refuses_unpins_and_the_next_look_pins_again() -> None:
    """A move to a CPU that is not there (offline, out of the cpuset) fails: every thread
    goes back on the CPUs allowed, nothing raises, and the next look pins again; a spawn
    meanwhile is not failed."""
    lost, after, looked, pinned, spawned = in_own_process(f"""
        assert pin._move({max(ALLOWED) + 1}, "test") is None
        lost, after = pin.cpu, masks()
        with pin.for_children():
            pass
        looked = pin.look()
        result = [lost, after, looked, masks(), pin.cpu is not None]
    """)
    assert lost is None and after == [ALLOWED]
    assert looked in ALLOWED and pinned == [[looked]] and spawned


@several
def test_auto_that_cannot_read_the_load_stays_where_it_started() -> None:
    """/proc/stat hidden (systemd's ProcSubset=pid): pinned, and no look moves it."""
    pinned, looked = in_own_process("""
        result = [masks() == [(pin.cpu,)], pin.look()]
    """, hidden=True)
    assert pinned and looked is None


def test_a_look_at_the_real_load_stays_or_moves_within_the_cpus_allowed() -> None:
    moved, seen = in_own_process("""
        import time
        time.sleep(0.2)
        moved = pin.look()
        result = [moved, masks()]
    """)
    assert moved is None or moved in ALLOWED
    assert len(seen) == 1 and len(seen[0]) == (1 if len(ALLOWED) > 1 else len(ALLOWED))


def test_auto_moves_when_the_load_that_is_not_its_own_is_heavier_than_elsewhere() -> None:
    # Our CPU busy 0.9 of which 0.1 ours: 0.8 foreign against 0.1 elsewhere: move.
    assert move_to(0, {0: 0.9, 1: 0.1}, own=0.1) == 1
    # Busy with our own work only: moving would take it along, so stay.
    assert move_to(0, {0: 0.9, 1: 0.1}, own=0.85) is None
    # Within the margin (a fifth of a core): stay, so two daemons do not swap back and forth.
    assert move_to(0, {0: 0.5, 1: 0.35}, own=0.0) is None
    assert move_to(0, {0: 0.6, 1: 0.35}, own=0.0) == 1
    # The least busy of the others; on a tie the lower number.
    assert move_to(2, {0: 0.3, 1: 0.1, 2: 1.0, 3: 0.1}, own=0.0) == 1
    assert move_to(0, {0: 1.0}, own=0.0) is None  # nowhere else


def test_the_shares_are_read_from_tick_differences() -> None:
    last = ({0: (100, 1000), 1: (500, 1000), 2: (0, 0)}, 40)
    now = ({0: (190, 1100), 1: (510, 1100), 2: (0, 0)}, 80)
    busy, own = shares(last, now, frozenset({0, 1, 2}), ours=0)
    assert busy == {0: 0.9, 1: 0.1, 2: 0.0}  # a CPU whose ticks did not move: idle
    assert own == 0.4  # 40 of our CPU's 100 ticks
    # A CPU the process may not use is not counted; ours gone from /proc: no own share.
    busy, own = shares(last, now, frozenset({1}), ours=0)
    assert busy == {1: 0.1} and own == 0.0


async def test_a_daemon_run_in_process_pins_nothing(client: AsyncClient) -> None:
    """The tests' daemons run inside pytest's process: only `sessiond`'s main pins."""
    await client.append_message((await client.create_session()).session_id, "user", "hi")
    assert set(map(tuple, masks(os.getpid()).values())) == {tuple(ALLOWED)}


def test_a_refused_call_leaves_auto_unpinned_and_stops_a_number(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Where a seccomp filter refuses sched_setaffinity (EPERM: systemd's ~@resources), `auto`
    serves unpinned and says why; a CPU number stops the start (exit 78 in main)."""
    from sessiond_daemon.cpu import Pin

    def refused(pid: int, cpus: object) -> None:
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(os, "sched_setaffinity", refused)
    auto = Pin()
    auto.start("auto")
    assert auto.cpu is None and auto.look() is None
    with auto.for_children():  # a spawn goes on as if nothing were pinned
        pass
    if len(ALLOWED) >= 2:
        with pytest.raises(ValueError, match="SystemCallFilter=sched_setaffinity"):
            Pin().start(ALLOWED[0])


@several
def test_a_number_the_kernel_refuses_stops_the_start_with_78(short_dir: str) -> None:
    """Through `sessiond`'s main, as under a unit whose filter refuses the call."""
    script = textwrap.dedent(f"""
        import os, sys
        def refused(pid, cpus):
            raise PermissionError(1, "Operation not permitted")
        os.sched_setaffinity = refused
        from sessiond_daemon.__main__ import main
        main(["--socket", {os.path.join(short_dir, "r.sock")!r},
              "--db", {os.path.join(short_dir, "r.db")!r}, "--cpu-affinity", "{ALLOWED[0]}"])
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, timeout=60)
    assert done.returncode == 78, done.stderr
    assert b"SystemCallFilter=sched_setaffinity" in done.stderr
    assert not os.path.exists(os.path.join(short_dir, "r.sock"))
