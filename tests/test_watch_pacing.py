"""WatchPacing: a watch the server ends at once holds back the next one; anything else not."""

from __future__ import annotations

import logging

import httpx2
import pytest

from plugin.serving.dra import watch_pacing
from plugin.serving.dra.watch_pacing import WatchPacing


@pytest.fixture
def slept(monkeypatch):
    waits: list[float] = []

    async def sleep(seconds):
        waits.append(seconds)

    monkeypatch.setattr(watch_pacing.asyncio, "sleep", sleep)
    return waits


class Body(httpx2.AsyncByteStream):
    """A streamed body, as a watch's is: read as it comes, not loaded up front."""

    def __init__(self, chunk: bytes) -> None:
        self.chunk = chunk

    async def __aiter__(self):
        if self.chunk:
            yield self.chunk


def server(bodies):
    """A server answering each watch with the next body (b"": ended at once, empty)."""
    answers = iter(bodies)

    def handle(request):
        if "watch" in request.url.params:
            return httpx2.Response(200, stream=Body(next(answers)))
        return httpx2.Response(200, content=b"{}")
    return httpx2.MockTransport(handle)


async def watch(client, read=True):
    async with client.stream("GET", "http://api/slices", params={"watch": "true"}) as response:
        if read:
            async for _ in response.aiter_bytes():
                pass


async def test_watches_ended_at_once_back_off_doubling_and_say_so_once(slept, caplog):
    pacing = WatchPacing(server([b""] * 8), backoff_initial=0.2, backoff_max=1.0)
    async with httpx2.AsyncClient(transport=pacing) as client:
        with caplog.at_level(logging.WARNING):
            for _ in range(8):
                await watch(client)
    assert slept == [0.2, 0.4, 0.8, 1.0, 1.0, 1.0, 1.0]
    assert len([r for r in caplog.records if "ends watches at once" in r.getMessage()]) == 1


async def test_a_watch_that_delivers_an_event_sets_the_pace_back(slept):
    event = b'{"type":"ADDED","object":{}}\n'
    pacing = WatchPacing(server([b"", b"", event, b""]), backoff_initial=0.2)
    async with httpx2.AsyncClient(transport=pacing) as client:
        for _ in range(4):
            await watch(client)
        await client.get("http://api/slices")  # not a watch: never held back
    assert slept == [0.2, 0.4] and pacing.cut_short == 1


async def test_a_watch_its_reader_gave_up_is_not_counted(slept):
    pacing = WatchPacing(server([b"", b"", b""]), backoff_initial=0.2)
    async with httpx2.AsyncClient(transport=pacing) as client:
        await watch(client)
        await watch(client, read=False)  # closed by us (a lifetime ended, a stop)
        await watch(client)
    assert slept == [0.2] and pacing.cut_short == 1


async def test_one_paths_watches_ended_at_once_do_not_hold_back_anothers(slept, caplog):
    """As client-go keeps a back-off per reflector: the node watch being cut short must not
    delay the slice watch that puts back what a kubelet start wiped."""
    pacing = WatchPacing(server([b""] * 6), backoff_initial=0.2)
    async with httpx2.AsyncClient(transport=pacing) as client:
        with caplog.at_level(logging.WARNING):
            for _ in range(4):
                async with client.stream("GET", "http://api/nodes",
                                         params={"watch": "true"}) as response:
                    async for _ in response.aiter_bytes():
                        pass
            before = list(slept)
            await watch(client)  # the first slice watch: no pause of its own
    assert before == [0.2, 0.4, 0.8] and slept == before
    assert len([r for r in caplog.records if "ends watches at once" in r.getMessage()]) == 1
