"""Worker processes for the SDK concurrency tests: `python sdk_workers.py SDK FDS ARGS`.

FDS is "r,w;r,w;...": one pair of pipe descriptors per worker. The first process imports
the SDK, then forks one process per further pair; worker i (named p<i>) has its own SDK
store object, reads commands from its r, one a line, and answers each with one JSON line
on its w, so a test can drive them in a fixed order (the same script against two stores)
or let them run free (sdk_extras.Workers).

    adk FDS SOCKET DB_URL     commands: "load STORE", "append STORE N", "burst N", "exit"
    openai FDS SOCKET         commands: "burst N", "exit"
    langgraph FDS SOCKET      commands: "burst N", "exit"
"""

from __future__ import annotations

import asyncio
import importlib
import json
import os
import sys
from collections.abc import Callable, Coroutine
from typing import Any


def _answer(value: Any) -> None:
    sys.stdout.write(json.dumps(value) + "\n")
    sys.stdout.flush()


async def adk(name: str, socket: str, db_url: str) -> None:
    from google.adk.errors import StaleSessionError
    from google.adk.events.event import Event
    from google.adk.events.event_actions import EventActions
    from google.adk.sessions.database_session_service import DatabaseSessionService
    from google.genai import types

    from sessiond.integrations.adk import SessiondSessionService

    stores: dict[str, Any] = {"sessiond": SessiondSessionService(socket)}
    if db_url != "-":
        stores["database"] = DatabaseSessionService(db_url)
    copies: dict[str, Any] = {}

    def event(n: int) -> Event:
        return Event(id=f"{name}-{n}", author="agent", invocation_id=f"{name}-{n}",
                     content=types.Content(role="model", parts=[types.Part(text=f"{name} {n}")]),
                     actions=EventActions(state_delta={f"by_{name}": n}))

    async def load(store: str) -> None:
        copies[store] = await stores[store].get_session(app_name="race", user_id="u",
                                                        session_id="s")

    for line in iter(sys.stdin.readline, ""):
        cmd = line.split()
        if cmd[0] == "exit":
            break
        if cmd[0] == "load":
            await load(cmd[1])
            _answer("ok")
        elif cmd[0] == "append":
            try:
                await stores[cmd[1]].append_event(copies[cmd[1]], event(int(cmd[2])))
                _answer("ok")
            except StaleSessionError:
                _answer("stale")
        elif cmd[0] == "burst":  # append N events; a refused one is retried after a reload
            refused = 0
            await load("sessiond")
            for n in range(int(cmd[1])):
                while True:
                    try:
                        await stores["sessiond"].append_event(copies["sessiond"],
                                                              event(10_000 + n))
                        break
                    except StaleSessionError:
                        refused += 1
                        await load("sessiond")
            _answer({"refused": refused})
    for store in stores.values():
        await store.close()


async def openai(name: str, socket: str) -> None:
    from sessiond.integrations.openai_agents import SessiondSession

    session = SessiondSession("race", socket=socket)
    for line in iter(sys.stdin.readline, ""):
        cmd = line.split()
        if cmd[0] == "exit":
            break
        for n in range(int(cmd[1])):
            await session.add_items([{"role": "user", "content": f"{name} {n}"}])
        _answer("ok")
    session.close()


def langgraph(name: str, socket: str) -> None:
    from langgraph.checkpoint.base import empty_checkpoint

    from sessiond.integrations.langgraph import SessiondSaver

    with SessiondSaver.from_socket(socket) as saver:
        for line in iter(sys.stdin.readline, ""):
            cmd = line.split()
            if cmd[0] == "exit":
                break
            config: Any = {"configurable": {"thread_id": "race", "checkpoint_ns": ""}}
            for n in range(int(cmd[1])):
                checkpoint = empty_checkpoint()
                checkpoint["id"] = f"{name}-{n:04}"
                checkpoint["channel_values"] = {"by": f"{name} {n}"}
                checkpoint["channel_versions"] = {"by": saver.get_next_version(None, None)}
                config = saver.put(config, checkpoint, {"source": "loop", "step": n},
                                   {"by": checkpoint["channel_versions"]["by"]})
                saver.put_writes(config, [("by", f"{name} write {n}")], f"task-{name}-{n}")
            _answer("ok")


_PRELOAD = {"adk": ["sessiond.integrations.adk",
                    "google.adk.sessions.database_session_service"],
            "openai": ["sessiond.integrations.openai_agents"],
            "langgraph": ["sessiond.integrations.langgraph"]}


def main() -> None:
    sdk, spec, *args = sys.argv[1:]
    pairs = [tuple(map(int, pair.split(","))) for pair in spec.split(";")]
    for module in _PRELOAD[sdk]:
        importlib.import_module(module)
    children: list[int] = []
    index = 0
    for i in range(1, len(pairs)):
        pid = os.fork()
        if pid == 0:
            index, children = i, []
            break
        children.append(pid)
    for j, (r, w) in enumerate(pairs):
        if j != index:
            os.close(r)
            os.close(w)
    sys.stdin = os.fdopen(pairs[index][0])
    sys.stdout = os.fdopen(pairs[index][1], "w")
    code = 0
    try:
        if sdk == "langgraph":
            langgraph(f"p{index}", *args)
        else:
            runners: dict[str, Callable[..., Coroutine[Any, Any, None]]] = {
                "adk": adk, "openai": openai}
            asyncio.run(runners[sdk](f"p{index}", *args))
    except BaseException:
        import traceback

        traceback.print_exc()
        code = 1
    for pid in children:
        code |= os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) != 0
    sys.stdout.flush()
    os._exit(code)


if __name__ == "__main__":
    main()
