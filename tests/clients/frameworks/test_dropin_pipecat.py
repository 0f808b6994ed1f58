"""The real Pipecat `ElevenLabsTTSService` and `CartesiaTTSService`, unmodified, pointed at voxgate by their
URL parameter (docs/elevenlabs.md, docs/cartesia.md): they speak, the words reach Pipecat's context, an
interruption mid-reply stops the audio (in Pipecat and at the server) and the context keeps what was heard,
and every turn, the interrupted one included, goes over the one socket the service opened."""

from __future__ import annotations

import asyncio
import time

import pytest
from clients.frameworks.conftest import Server
from clients.frameworks.pipecat_rig import LONG, SHORT, Rig, Speaker, Tap, User, until, words
from pipecat.processors.aggregators.llm_context import LLMContext
from pipecat.processors.aggregators.llm_response_universal import LLMAssistantAggregator
from pipecat.services.cartesia.tts import CartesiaTTSService
from pipecat.services.elevenlabs.tts import ElevenLabsTTSService

pytestmark = [pytest.mark.clients, pytest.mark.asyncio, pytest.mark.timeout(180)]
PATHS = {"elevenlabs": "/v1/text-to-speech/joe/multi-stream-input", "cartesia": "/tts/websocket"}


def service(provider: str, server: str) -> object:
    if provider == "elevenlabs":
        return ElevenLabsTTSService(api_key="any", url=f"ws://{server}",
                                    settings=ElevenLabsTTSService.Settings(voice="joe"))  # fmt: skip
    return CartesiaTTSService(api_key="any", url=f"ws://{server}/tts/websocket",
                              settings=CartesiaTTSService.Settings(voice="joe"))  # fmt: skip


def _rig(tts: object) -> Rig:
    user, speaker, tap, context = User(), Speaker(), Tap(), LLMContext()
    rig = Rig.around([user, tts, speaker, tap, LLMAssistantAggregator(context)])  # type: ignore[list-item]
    rig.user, rig.speaker, rig.tap, rig.context = user, speaker, tap, context
    return rig


@pytest.mark.parametrize("provider", ["elevenlabs", "cartesia"])
async def test_the_real_service_speaks_through_voxgate_and_its_words_reach_the_context(
    voxgate_server: str, provider: str
) -> None:
    rig = _rig(service(provider, voxgate_server))

    async def script(rig: Rig) -> None:
        for _ in range(2):  # two turns on one socket
            await rig.reply(SHORT)
            await until(lambda: words(rig.assistant_text()).count(words(SHORT)[-1]) >= 1, 40)

    await rig.run(script)
    assert rig.speaker.played_s > 1.5
    assert words(rig.assistant_text())[: len(words(SHORT))] == words(SHORT)


# 12 tokens/s: the LLM is still writing when the user barges in (the context's text is open: Pipecat's
# ElevenLabs closes it, its Cartesia cancels it); None: the whole reply was sent and its context ended
# (ElevenLabs: flush + close_context, then a second close_context at the interruption; Cartesia: continue
# false, then cancel).
@pytest.mark.parametrize("tokens_per_s", [12, None], ids=["writing", "all-sent"])
@pytest.mark.parametrize("provider", ["elevenlabs", "cartesia"])
async def test_an_interruption_stops_the_audio_and_the_context_keeps_what_was_heard_on_one_socket(
    voxgate: Server, provider: str, tokens_per_s: float | None
) -> None:
    rig = _rig(service(provider, voxgate.addr))
    sockets = voxgate.accepted(PATHS[provider])
    marks: dict[str, float] = {}

    async def script(rig: Rig) -> None:
        replying = asyncio.create_task(rig.reply(LONG, tokens_per_s=tokens_per_s))
        await until(lambda: rig.speaker.played_s >= 1.5, 30)
        marks["played_at_interrupt"] = rig.speaker.played_s
        replying.cancel()  # the user speaks: the LLM's reply stops with the turn
        await rig.user.broadcast_interruption()
        marks["audio_went_on_s"] = await voxgate.audio_settles()  # nothing else speaks meanwhile
        marks["played_after"] = rig.speaker.played_s  # any stale audio would have played by now
        marks["heard"] = len(rig.assistant_text())
        for turn in range(2):  # the next turns on the same socket speak whole, promptly
            await until(lambda: time.monotonic() - rig.speaker.last_write > 0.3, 20)  # the speaker is idle
            before, asked = rig.speaker.played_s, time.monotonic()
            await rig.reply(SHORT)
            await until(lambda b=before: rig.speaker.played_s > b, 10)
            marks[f"first_audio_{turn}"] = time.monotonic() - asked
            await until(lambda t=turn: words(rig.assistant_text()).count(words(SHORT)[-1]) > t, 30)

    await rig.run(script)
    # Pipecat plays at most the chunk being written at the interruption; the server sent nothing more.
    assert marks["played_after"] - marks["played_at_interrupt"] < 0.3
    assert marks["audio_went_on_s"] < 0.5
    # The context keeps the words heard before the interruption: a prefix of LONG, not all of it.
    heard = rig.assistant_text()[: int(marks["heard"])]
    assert 0 < len(words(heard)) < len(words(LONG)) and words(LONG)[: len(words(heard))] == words(heard), heard
    assert words(rig.assistant_text()).count(words(SHORT)[-1]) == 2
    assert max(marks["first_audio_0"], marks["first_audio_1"]) < 2.5  # Pipecat drops a context silent for 3 s
    assert voxgate.accepted(PATHS[provider]) - sockets == 1  # every turn on the one socket
