"""sessionctl web: open the daemon's web view (docs/web.md) in a browser, or print its URL."""

from __future__ import annotations

import argparse
import json
import os
import sys
import webbrowser
from typing import Any

from sessiond_schemas.paths import http_listen_path, http_token_path, older_names

from .._sync import Client
from .registry import STREAMED, CliError, arg, command


def page_url(socket_path: str) -> str:
    """The web view's URL on the daemon's first TCP listener, its owner's token in the
    path; CliError when the HTTP face is off or listens on Unix sockets only."""
    # The socket's own files; a daemon of an earlier release wrote sessiond.http-* for
    # every socket name (read only when the socket's own are not there).
    listen_file, token_file = http_listen_path(socket_path), http_token_path(socket_path)
    for listen, tok in zip(older_names(listen_file), older_names(token_file), strict=True):
        if os.path.exists(listen):
            listen_file, token_file = listen, tok
            break
    try:
        with open(listen_file, encoding="utf-8") as f:
            bound: list[str] = json.load(f)
    except (OSError, ValueError) as exc:
        raise CliError("the daemon's HTTP face is off: start sessiond with"
                       " --http-listen 127.0.0.1:4437 (docs/http.md)", "http_off", 1,
                       {"path": http_listen_path(socket_path)}) from exc
    tcp = [a for a in bound if "/" not in a]
    if not tcp:
        raise CliError(f"the HTTP face listens on Unix sockets only ({', '.join(bound)}),"
                       " which a browser cannot open: add --http-listen 127.0.0.1:4437",
                       "http_unix_only", 1, {"listening": bound})
    try:
        with open(token_file, encoding="utf-8") as f:
            token = f.read().strip()
    except OSError as exc:
        raise CliError(f"cannot read the HTTP token {token_file}: {exc.strerror}",
                       "file_error", 1) from exc
    return f"http://{tcp[0]}/t/{token}/ui/"


@command("web", "open the web view in a browser (or print its URL, with the token in it)",
         sid=False, args=[arg("--print", action="store_true", dest="print_only",
                              help="print the URL instead of opening a browser")])
def _web(c: Client, a: argparse.Namespace) -> Any:
    url = page_url(c.socket_path)
    if a.json:
        return {"url": url}
    if a.print_only or not _open(url):
        print(url)
    else:
        print("opened the web view in your browser", file=sys.stderr)
    return STREAMED


def _open(url: str) -> bool:
    """Open `url` in the user's browser, if there is one to open (never a text browser)."""
    try:
        browser = webbrowser.get()
    except webbrowser.Error:
        return False
    if isinstance(browser, webbrowser.GenericBrowser) and browser.name in (
            "www-browser", "lynx", "links", "elinks", "w3m"):
        return False  # it would take over this terminal
    return browser.open(url)
