"""The daemon starts in-process and answers."""

import pytest

from sessiond import AsyncClient

pytestmark = pytest.mark.anyio


async def test_ping(client: AsyncClient) -> None:
    """daemon.ping answers pong with the version."""
    result = await client.ping()
    assert result.pong is True
