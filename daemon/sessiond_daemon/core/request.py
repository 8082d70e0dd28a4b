"""What the serving layer tells the features about the request being served: the byte
budget of one page of a paged read, and whether its client has gone."""

from __future__ import annotations

from collections.abc import Callable
from contextvars import ContextVar

# The byte budget of one page of a paged read (message.list, events.read, ...). The
# server sets it for each request: max_page_bytes, or a share of it for a batch item.
page_budget: ContextVar[int] = ContextVar("page_budget", default=4 << 20)
# Whether the client of the request being served has gone (its socket closed), set by
# the server per connection: long reads (session.search) stop when nobody waits for them.
client_gone: ContextVar[Callable[[], bool]] = ContextVar("client_gone",
                                                         default=lambda: False)
