"""Every client method shows its real parameters: `inspect.signature` works on Client,
AsyncClient and LoopClient (class and instance), no method takes `**options`, and a
misspelt keyword is refused before anything is sent."""

from __future__ import annotations

import inspect
from typing import Any

import pytest
from conftest import Daemon

from sessiond import AsyncClient, Client
from sessiond._methods import Methods, rpc_method
from sessiond.integrations._loop import LoopClient

pytestmark = pytest.mark.anyio

METHODS = sorted(name for name, value in vars(Methods).items() if isinstance(value, rpc_method))
CLIENTS = (Client, AsyncClient, LoopClient)


class TestSignatures:
    def test_every_method_is_found(self) -> None:
        """The list below is the API's (a method added to Methods is checked too)."""
        assert {"append_message", "record_tokens", "transition", "spawn", "search"} <= set(
            METHODS)
        assert len(METHODS) >= 39

    @pytest.mark.parametrize("cls", CLIENTS, ids=lambda c: c.__name__)
    @pytest.mark.parametrize("name", METHODS)
    def test_signature_on_class_and_instance(self, cls: type[Any], name: str) -> None:
        """inspect.signature answers on the class (with `self`) and on an instance
        (without), with no **kwargs, and the result type where Call[...] was written."""
        on_class = inspect.signature(getattr(cls, name))
        instance = cls.__new__(cls)  # no connection needed to read a signature
        bound = inspect.signature(getattr(instance, name))
        assert next(iter(on_class.parameters)) == "self"
        assert list(bound.parameters) == list(on_class.parameters)[1:]
        kinds = {p.kind for p in bound.parameters.values()}
        assert inspect.Parameter.VAR_KEYWORD not in kinds, f"{name} takes **kwargs"
        assert inspect.Parameter.VAR_POSITIONAL not in kinds, f"{name} takes *args"
        result = on_class.return_annotation  # what the caller gets, as written in Call[...]
        assert isinstance(result, str) and result and "Call[" not in result
        if issubclass(cls, Client):
            assert bound.return_annotation == result
        else:  # an AsyncClient's (and LoopClient's) methods return awaitables of it
            assert bound.return_annotation == f"Awaitable[{result}]"
        assert getattr(cls, name).__doc__ and getattr(instance, name).__doc__

    def test_the_issue_s_parameters_are_there(self) -> None:
        """What an editor must complete: tool_call_id, expected_version, idempotency_key."""
        append = inspect.signature(Client.append_message).parameters
        assert {"tool_call_id", "metadata", "expected_version", "idempotency_key"} <= set(append)
        tokens = inspect.signature(Client.record_tokens).parameters
        assert list(tokens) == ["self", "session_id", "input_tokens", "output_tokens",
                                "estimated_cost", "model", "expected_version",
                                "idempotency_key"]
        assert tokens["input_tokens"].kind is inspect.Parameter.KEYWORD_ONLY
        assert str(tokens["input_tokens"].annotation) == "int | None"
        assert inspect.signature(Client.record_tokens).return_annotation == \
            "rpc.TokensRecordResult"

    def test_every_write_takes_the_write_options(self) -> None:
        """Each method whose RPC is a write takes both write options (fork: the key only,
        as session.fork's params)."""
        writes = ["create_session", "transition", "resume", "delete_session",
                  "append_message", "append_messages", "pop_message", "clear_messages",
                  "record_tokens", "record_progress", "update_memory", "save_checkpoint",
                  "append_events", "link_plan", "record_result"]
        for name in writes:
            params = inspect.signature(getattr(Client, name)).parameters
            assert {"expected_version", "idempotency_key"} <= set(params), name
        assert "idempotency_key" in inspect.signature(Client.fork).parameters


class TestUnknownKeywords:
    async def test_misspelt_keyword_is_refused_before_sending(self, client: AsyncClient,
                                                              daemon: Daemon) -> None:
        """A misspelt option is a TypeError naming it, and nothing reaches the daemon."""
        s = await client.create_session(task="typed")
        with pytest.raises(TypeError, match="idempotency_kee"):
            await client.append_message(s.session_id, "user", "x",  # type: ignore[call-arg]
                                        idempotency_kee="k")
        assert (await client.get_session(s.session_id)).message_count == 0

    async def test_keywords_reach_the_daemon(self, client: AsyncClient) -> None:
        """The named keywords are sent as the params of the same name: a tool message with
        its tool_call_id, a stale expected_version refused, an idempotent retry."""
        from sessiond import VersionConflictError

        s = await client.create_session(task="typed", metadata={"k": 1})
        first = await client.append_message(s.session_id, "tool", "out", tool_call_id="c1",
                                            idempotency_key="once")
        again = await client.append_message(s.session_id, "tool", "out", tool_call_id="c1",
                                            idempotency_key="once")
        assert again == first
        [message] = (await client.list_messages(s.session_id, limit=5)).messages
        assert message.tool_call_id == "c1"
        with pytest.raises(VersionConflictError):
            await client.record_tokens(s.session_id, input_tokens=1, expected_version=1)
        usage = await client.record_tokens(s.session_id, input_tokens=2, output_tokens=3,
                                           model="m", expected_version=first.version)
        assert (usage.token_usage.input_tokens, usage.token_usage.output_tokens) == (2, 3)


def test_help_lists_the_parameters() -> None:
    """`help(sessiond.Client.append_message)` (README.md) shows the keywords and the doc."""
    import pydoc

    for target in (Client.append_message, Client.__new__(Client).append_message):
        text = pydoc.render_doc(target, renderer=pydoc.plaintext)
        assert "tool_call_id: 'str | None' = None" in text
        assert "expected_version: 'int | None' = None" in text
        assert "idempotency_key: 'str | None' = None" in text
        assert "Append one message" in text


def test_the_parameters_are_the_params_fields() -> None:
    """Each method sends exactly its RPC method's params fields (schemas' METHODS), so no
    option is missing from the signature and none is made up. The one exception:
    list_checkpoints returns the checkpoints alone, so it cannot page (after_version)."""
    from sessiond_schemas import rpc

    for name in METHODS:
        build = getattr(Client, name).__wrapped__
        required = [p for p in list(inspect.signature(build).parameters.values())[1:]
                    if p.default is inspect.Parameter.empty]
        call = build(None, *(object() for _ in required))
        fields = set(rpc.METHODS[call.method][0].__struct_fields__)
        if name == "list_checkpoints":
            fields.discard("after_version")
        assert set(call.params) == fields, name
