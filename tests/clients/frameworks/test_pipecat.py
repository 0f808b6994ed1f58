"""The real Pipecat speaking through voxgate: `VoxgateTTSService` in a pipeline (clients/frameworks/pipecat_rig.py)
with a real-time speaker and Pipecat's own assistant aggregator."""

from __future__ import annotations

import asyncio

import pytest
from clients.frameworks.pipecat_rig import LONG, SHORT, Rig, until, words

pytestmark = pytest.mark.clients


async def test_a_pipeline_speaks_and_the_words_reach_pipecat_in_time(voxgate_server: str) -> None:
    rig = Rig(voxgate_server)

    async def script(rig: Rig) -> None:
        await rig.reply(SHORT)
        await until(lambda: rig.assistant_text() != "", 30)  # the turn ended: its words went into the context

    await rig.run(script)
    assert rig.speaker.played_s > 1.5
    assert words(" ".join(rig.tap.words)) == words(SHORT), rig.tap.words
    assert words(rig.assistant_text()) == words(SHORT)


# 12 tokens/s: the LLM is still writing when the user barges in (LONG takes about 5 s to arrive), so the
# server cuts the utterance; None: the whole reply at once, whose audio may all have arrived (the server
# had nothing left to cut and says so, with what was heard) while Pipecat still plays it.
@pytest.mark.parametrize(("contexts", "tokens_per_s"), [(False, 12), (True, 12), (False, None)],
                         ids=["utterances", "contexts", "all-sent"])  # fmt: skip
async def test_an_interruption_cancels_on_the_same_socket_and_the_context_holds_what_played(
    voxgate_server: str, contexts: bool, tokens_per_s: float | None
) -> None:
    rig = Rig(voxgate_server, contexts=contexts)
    marks: dict[str, object] = {}

    async def script(rig: Rig) -> None:
        replying = asyncio.create_task(rig.reply(LONG, tokens_per_s=tokens_per_s))
        await until(lambda: rig.speaker.played_s >= 1.5, 30)
        socket = rig.tts._vx_session.websocket  # type: ignore[union-attr]
        marks["played_at_interrupt"] = rig.speaker.played_s
        replying.cancel()  # the user speaks: the LLM's reply stops with the turn
        await rig.user.broadcast_interruption()
        await until(lambda: bool(rig.cancelled), 10)
        await asyncio.sleep(0.6)  # any stale audio would play now
        marks["played_after"] = rig.speaker.played_s
        marks["same_socket"] = rig.tts._vx_session is not None and rig.tts._vx_session.websocket is socket
        # The socket goes on: the next reply speaks whole.
        await rig.reply(SHORT)
        await until(lambda: SHORT.split()[-1].strip(".") in rig.assistant_text(), 30)

    await rig.run(script)
    answer = rig.cancelled[0]
    assert (answer.cancelled or tokens_per_s is None) and marks["same_socket"]
    # What played after the interruption is at most the chunk being written at that moment (40 ms).
    assert float(marks["played_after"]) - float(marks["played_at_interrupt"]) < 0.3  # type: ignore[arg-type]
    heard = rig.assistant_text().split(SHORT.split()[0])[0]  # the interrupted turn's record, before the next reply
    assert 0 < len(words(heard)) < len(words(LONG))
    assert words(LONG)[: len(words(heard))] == words(heard)
    # The server's account of what was heard, from played_ms: a word counts there once half of it played,
    # in Pipecat once it began.
    assert answer.heard_text is not None
    assert abs(len(words(answer.heard_text)) - len(words(heard))) <= 1, (answer.heard_text, heard)
