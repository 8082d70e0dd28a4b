"""The web view shows a compaction as a boundary in the session's timeline (issue 48),
with the history before it still there above it; in a real browser."""

from __future__ import annotations

from typing import Any

import pytest
from conftest import Daemon
from test_web import WAIT_MS, browser, daemon_overrides, new_page, page_url  # noqa: F401

from sessiond import AsyncClient

pytestmark = pytest.mark.anyio


async def test_the_timeline_shows_the_boundary_and_what_came_before(
        daemon: Daemon, client: AsyncClient, browser: Any) -> None:  # noqa: F811
    await client.create_session("web-c")
    await client.append_messages("web-c", [{"role": "user", "content": "before the summary"},
                                           {"role": "assistant", "content": "an answer"}])
    await client.compact("web-c", [{"role": "system", "content": "what was said so far"}],
                         by="user")
    await client.append_message("web-c", "user", "after the summary")
    page, _ = await new_page(browser)
    await page.goto(page_url(daemon) + "#/s/web-c")
    boundary = page.locator("#timeline > li[data-type='session.compacted']")
    await boundary.wait_for(timeout=WAIT_MS)
    assert "compaction" in (await boundary.get_attribute("class") or "")
    assert "#0–#1 summarized by user" in await boundary.inner_text()
    assert "[system] what was said so far" in await boundary.inner_text()
    texts = [await li.inner_text() for li in await page.locator("#timeline > li").all()]
    assert any("before the summary" in t for t in texts)  # the history before it stays
    assert any("after the summary" in t for t in texts)
    assert page.errors == []
