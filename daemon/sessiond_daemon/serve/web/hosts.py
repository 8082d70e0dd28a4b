"""Which Host and Origin an HTTP listener answers (docs/security.md, "DNS rebinding").

A page on another site can make a browser send requests to a loopback address (DNS
rebinding: its own name resolves to 127.0.0.1), and a local proxy in front of the Unix
HTTP socket forwards whatever a browser sends it, as the proxy's uid. The browser still
says where the request is going (Host) and, on a write, which page sends it (Origin):
- Host must name loopback (`localhost`, `*.localhost`, a loopback address), the address
  the request came in on (the listener's own), or one of `http_allowed_hosts`; a missing
  Host (HTTP/1.0, never a browser's) passes.
- A write (any method but GET, HEAD and OPTIONS) with an Origin must come from the face's
  own origin (its host and port are the request's Host) or one of `http_cors_origins`
  (`*`: any). A browser sends Origin with every such request, a `no-cors` one included;
  a client that is not a browser sends none, and passes.
"""

from __future__ import annotations

import ipaddress
from typing import Any
from urllib.parse import urlsplit

from sessiond_daemon.serve.web.codec import HttpError

READS = ("GET", "HEAD", "OPTIONS")


def name_of(host: str) -> str:
    """The name or address in a Host header, without its port, lower case; "" if it is
    not one (a bracket left open, a port that is not a number)."""
    host = host.strip().lower()
    if host.startswith("["):
        end = host.find("]")
        rest = host[end + 1:] if end > 0 else "x"
        if rest and not (rest.startswith(":") and rest[1:].isdigit()):
            return ""
        return host[1:end]
    name, colon, port = host.partition(":")
    if colon and not port.isdigit():
        return ""
    return name.removesuffix(".")


def _loopback(name: str) -> bool:
    if name == "localhost" or name.endswith(".localhost"):  # RFC 6761: never DNS's
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def allowed_host(scope: dict[str, Any], host: str, allowed: frozenset[str]) -> bool:
    name = name_of(host)
    if not name:
        return False
    if _loopback(name) or name in allowed:
        return True
    server = scope.get("server")  # (address, port) on TCP; None on a Unix socket
    if server and server[0]:
        own = str(server[0]).lower()
        try:
            return ipaddress.ip_address(own) == ipaddress.ip_address(name)
        except ValueError:
            return own == name
    return False


def own_origin(origin: str, host: str) -> bool:
    """Whether `origin` is the face's own: its host and port are the request's Host (the
    scheme aside: a TLS proxy in front turns https into http)."""
    try:
        netloc = urlsplit(origin.strip()).netloc.lower()
    except ValueError:
        return False
    return bool(netloc) and netloc == host.strip().lower()


def check(scope: dict[str, Any], host: str | None, origin: str | None,
          allowed_hosts: frozenset[str], cors_origins: frozenset[str]) -> None:
    """403 for a Host this listener does not answer to, or a write from another origin."""
    if host is not None and not allowed_host(scope, host, allowed_hosts):
        raise HttpError(403, f"Host {host[:100]!r} is not this daemon's: loopback, the"
                        " listener's address or http_allowed_hosts (a proxy must pass one"
                        " of them)")
    if (origin is not None and scope.get("method") not in READS
            and not (host is not None and own_origin(origin, host))
            and origin not in cors_origins and "*" not in cors_origins):
        raise HttpError(403, f"a write from the origin {origin[:100]!r}, which is neither"
                        " this daemon's own nor in http_cors_origins")
