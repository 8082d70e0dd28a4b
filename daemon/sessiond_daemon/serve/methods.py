"""The method table: each contract method's params type, handler and grant, in one place.

`table` names every method's handler explicitly; lifecycle.py builds it from the features
it assembles and hands it to the server, after `check` has proven that it serves exactly
the methods of the contract (`rpc.METHODS`), with the params and result types declared
there. Each entry is made by `Signature(params, result).served_by(handler)`, so mypy
checks that the handler takes those params and returns that result, or the result
already encoded (`msgspec.Raw`: the writer's answer, encoded once for its cache too).

To add a method: its params and result in the schemas (rpc.METHODS), its handler in the
feature module that owns it, and one line here.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import msgspec

from sessiond_daemon.core.access import append_grant, import_grant, memory_grant
from sessiond_daemon.core.writer import Command, Writer
from sessiond_daemon.features.context import Context
from sessiond_daemon.features.executors.methods import Executors
from sessiond_daemon.features.forks import Forks
from sessiond_daemon.features.graphs import Graphs
from sessiond_daemon.features.maintenance import Maintenance
from sessiond_daemon.features.retention import Retention
from sessiond_daemon.features.search import Search
from sessiond_daemon.features.service import Service
from sessiond_daemon.features.subscriptions import Subscriptions
from sessiond_schemas import rpc
from sessiond_schemas.events import EventMeta
from sessiond_schemas.state import SessionState

P = TypeVar("P", bound=msgspec.Struct)
R = TypeVar("R")

Handler = Callable[[Any, EventMeta], Awaitable[object]]
ConnectionHandler = Callable[[Subscriptions, Any], Awaitable[object]]


@dataclass(frozen=True, slots=True)
class Method:
    """One method as the server dispatches it."""

    params: type[msgspec.Struct]
    result: object  # the declared result type (rpc.METHODS)
    handler: Handler | None = None
    # Methods of the connection itself (events.subscribe): called with its subscriptions.
    on_connection: ConnectionHandler | None = None
    # The grant a call needs (core/access.py), when it is not the method's name.
    grant: Callable[[Any], str] | None = None
    # Writes that are one command to the writer: checks the params and makes the command
    # without waiting (raises the contract's error), so the socket hands it to the writer
    # where the line is read, with no task (serve/server.py); `handler` submits it.
    command: Callable[[Any, EventMeta], Command] | None = None


MethodTable = dict[str, Method]


@dataclass(frozen=True, slots=True)
class Signature(Generic[P, R]):
    """A method's declared types; `served_by` types its handler against them."""

    params: type[P]
    result: type[R]

    def served_by(self, handler: Callable[[P, EventMeta], Awaitable[R | msgspec.Raw]], *,
                  grant: Callable[[P], str] | None = None) -> Method:
        return Method(self.params, self.result, handler=handler, grant=grant)

    def served_by_writer(self, command: Callable[[P, EventMeta], Command], writer: Writer, *,
                         grant: Callable[[P], str] | None = None) -> Method:
        """A write that is one command (its result: the writer's encoded answer)."""
        async def handler(params: P, meta: EventMeta) -> msgspec.Raw:
            return msgspec.Raw(await writer.submit(command(params, meta)))
        return Method(self.params, self.result, handler=handler, grant=grant, command=command)

    def served_by_connection(self, handler: Callable[[Subscriptions, P], Awaitable[R]]
                             ) -> Method:
        return Method(self.params, self.result, on_connection=handler)


class MethodTableError(Exception):
    """The table and the contract disagree: a bug, found at start-up."""


def check(methods: MethodTable) -> None:
    """Prove the table serves exactly rpc.METHODS, with the declared params and results."""
    missing = sorted(rpc.METHODS.keys() - methods.keys())
    extra = sorted(methods.keys() - rpc.METHODS.keys())
    wrong = sorted(name for name, m in methods.items() if name in rpc.METHODS
                   and (m.params, m.result) != rpc.METHODS[name]
                   and (m.params, Any) != rpc.METHODS[name])
    served = sorted(name for name, m in methods.items()
                    if (m.handler is None) == (m.on_connection is None))
    if missing or extra or wrong or served:
        raise MethodTableError(
            f"the method table does not match the contract: missing {missing}, not in the"
            f" contract {extra}, other params or result {wrong}, not one handler {served}")


def table(service: Service, maintenance: Maintenance, graphs: Graphs,
          search: Search, forks: Forks, executors: Executors, context: Context,
          retention: Retention) -> MethodTable:
    """Every method of the contract and what serves it."""
    s, m, g, x = service, maintenance, graphs, executors
    return {
        # daemon
        "daemon.ping": Signature(rpc.NoParams, rpc.PingResult).served_by(s.daemon_ping),
        "daemon.stats": Signature(rpc.NoParams, rpc.StatsResult).served_by(s.daemon_stats),
        "daemon.verify": Signature(rpc.VerifyParams, rpc.VerifyResult).served_by(m.daemon_verify),
        "daemon.backup": Signature(rpc.BackupParams, rpc.BackupResult).served_by(
            m.daemon_backup),
        "daemon.reindex": Signature(rpc.NoParams, rpc.ReindexResult).served_by(
            search.daemon_reindex),
        # sessions
        "session.create": Signature(rpc.SessionCreateParams, SessionState).served_by(
            s.session_create),
        "session.get": Signature(rpc.SessionGetParams, SessionState).served_by(
            s.session_get),
        "session.resolve": Signature(rpc.SessionResolveParams, rpc.ResolveResult).served_by(
            s.session_resolve),
        "session.list": Signature(rpc.SessionListParams, rpc.SessionListResult).served_by(
            s.session_list),
        "session.states": Signature(rpc.SessionStatesParams, rpc.SessionStatesResult
                                    ).served_by(s.session_states),
        "session.transition": Signature(rpc.SessionTransitionParams, SessionState
                                        ).served_by(s.session_transition),
        "session.set_ttl": Signature(rpc.SessionSetTtlParams, SessionState).served_by(
            s.session_set_ttl),
        "session.resume": Signature(rpc.SessionResumeParams, rpc.SessionResumeResult
                                    ).served_by(s.session_resume),
        "session.delete": Signature(rpc.SessionDeleteParams, rpc.DeleteResult).served_by(
            s.session_delete),
        "state.get": Signature(rpc.StateGetParams, rpc.StateGetResult).served_by(s.state_get),
        # data lifecycle
        "session.cleanup": Signature(rpc.SessionCleanupParams, rpc.CleanupResult).served_by(
            m.session_cleanup),
        "session.export": Signature(rpc.SessionExportParams, dict).served_by(m.session_export),
        "session.import": Signature(rpc.SessionImportParams, SessionState).served_by(
            m.session_import, grant=import_grant),
        # messages, tokens, progress, memory, checkpoints
        "message.append": Signature(rpc.MessageAppendParams, rpc.MessageAppendResult
                                    ).served_by_writer(s.message_append, s.writer),
        "message.append_many": Signature(rpc.MessageAppendManyParams,
                                         rpc.MessageAppendManyResult
                                         ).served_by(s.message_append_many),
        "message.list": Signature(rpc.MessageListParams, rpc.MessageListResult).served_by(
            s.message_list),
        "message.pop": Signature(rpc.WriteParams, rpc.MessagePopResult).served_by(
            s.message_pop),
        "message.clear": Signature(rpc.WriteParams, rpc.MessageClearResult).served_by(
            s.message_clear),
        "tokens.record": Signature(rpc.TokensRecordParams, rpc.TokensRecordResult).served_by(
            s.tokens_record),
        "progress.record": Signature(rpc.ProgressRecordParams, rpc.ProgressRecordResult
                                     ).served_by(s.progress_record),
        "memory.update": Signature(rpc.MemoryUpdateParams, rpc.MemoryUpdateResult).served_by(
            s.memory_update, grant=memory_grant),
        "checkpoint.save": Signature(rpc.CheckpointSaveParams, rpc.CheckpointSaveResult
                                     ).served_by(s.checkpoint_save),
        "checkpoint.get": Signature(rpc.CheckpointGetParams, rpc.CheckpointGetResult
                                    ).served_by(s.checkpoint_get),
        "checkpoint.list": Signature(rpc.CheckpointListParams, rpc.CheckpointListResult
                                     ).served_by(s.checkpoint_list),
        "progress.list": Signature(rpc.ProgressListParams, rpc.ProgressListResult).served_by(
            s.progress_list),
        # raw events, and the connection's subscriptions
        "events.append": Signature(rpc.EventsAppendParams, rpc.WriteResult).served_by_writer(
            s.events_append, s.writer, grant=append_grant),
        "events.read": Signature(rpc.EventsReadParams, rpc.EventsReadResult).served_by(
            s.events_read),
        "events.subscribe": Signature(rpc.EventsSubscribeParams, rpc.SubscribeResult
                                      ).served_by_connection(Subscriptions.subscribe),
        "events.unsubscribe": Signature(rpc.EventsUnsubscribeParams, rpc.UnsubscribeResult
                                        ).served_by_connection(Subscriptions.unsubscribe),
        # executors
        "session.spawn": Signature(rpc.SessionSpawnParams, SessionState).served_by(
            x.session_spawn),
        "session.inject": Signature(rpc.SessionInjectParams, SessionState).served_by(
            x.session_inject),
        "session.kill": Signature(rpc.SessionRef, SessionState).served_by(x.session_kill),
        "session.output": Signature(rpc.SessionOutputParams, rpc.OutputResult).served_by(
            x.session_output),
        "session.trajectory": Signature(rpc.SessionTrajectoryParams, rpc.TrajectoryResult
                                        ).served_by(x.session_trajectory),
        # graphs (LangGraph checkpoints)
        "graph.put": Signature(rpc.GraphPutParams, rpc.WriteResult).served_by(g.graph_put),
        "graph.put_writes": Signature(rpc.GraphPutWritesParams, rpc.WriteResult).served_by(
            g.graph_put_writes),
        "graph.get": Signature(rpc.GraphGetParams, rpc.GraphGetResult).served_by(g.graph_get),
        "graph.list": Signature(rpc.GraphListParams, rpc.GraphListResult).served_by(
            g.graph_list),
        "graph.delete_runs": Signature(rpc.GraphRunsParams, rpc.GraphChangeResult).served_by(
            g.graph_delete_runs),
        "graph.copy": Signature(rpc.GraphCopyParams, rpc.GraphChangeResult).served_by(
            g.graph_copy),
        "graph.prune": Signature(rpc.GraphPruneParams, rpc.GraphChangeResult).served_by(
            g.graph_prune),
        "graph.delta_history": Signature(rpc.GraphDeltaHistoryParams,
                                         rpc.GraphDeltaHistoryResult).served_by(
            g.graph_delta_history),
        # search and fork
        "session.search": Signature(rpc.SessionSearchParams, rpc.SearchResult).served_by(
            search.session_search),
        "session.fork": Signature(rpc.SessionForkParams, SessionState).served_by(
            forks.session_fork),
        "session.forks": Signature(rpc.SessionForksParams, rpc.ForksResult).served_by(
            forks.session_forks),
        # compaction and the context read
        "session.compact": Signature(rpc.SessionCompactParams, SessionState).served_by(
            context.session_compact),
        "session.context": Signature(rpc.SessionContextParams, rpc.SessionContextResult
                                     ).served_by(context.session_context),
        "session.trim": Signature(rpc.SessionTrimParams, rpc.TrimResult).served_by(
            retention.session_trim),
    }
