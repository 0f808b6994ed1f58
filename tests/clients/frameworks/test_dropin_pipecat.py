"""The real Pipecat `ElevenLabsTTSService` and `CartesiaTTSService`, unmodified, pointed at voxgate by their
URL parameter (docs/elevenlabs.md, docs/cartesia.md): they speak, and the words reach Pipecat's context."""

from __future__ import annotations

import pytest
from clients.frameworks.pipecat_rig import SHORT, Rig, Speaker, Tap, User, until, words
from pipecat.processors.aggregators.llm_context import LLMContext
from pipecat.processors.aggregators.llm_response_universal import LLMAssistantAggregator
from pipecat.services.cartesia.tts import CartesiaTTSService
from pipecat.services.elevenlabs.tts import ElevenLabsTTSService

pytestmark = [pytest.mark.clients, pytest.mark.asyncio, pytest.mark.timeout(120)]


def _rig(tts: object) -> Rig:
    user, speaker, tap, context = User(), Speaker(), Tap(), LLMContext()
    rig = Rig.around([user, tts, speaker, tap, LLMAssistantAggregator(context)])  # type: ignore[list-item]
    rig.user, rig.speaker, rig.tap, rig.context = user, speaker, tap, context
    return rig


@pytest.mark.parametrize("provider", ["elevenlabs", "cartesia"])
async def test_the_real_service_speaks_through_voxgate_and_its_words_reach_the_context(
    voxgate_server: str, provider: str
) -> None:
    if provider == "elevenlabs":
        tts = ElevenLabsTTSService(api_key="any", url=f"ws://{voxgate_server}",
                                   settings=ElevenLabsTTSService.Settings(voice="joe"))  # fmt: skip
    else:
        tts = CartesiaTTSService(api_key="any", url=f"ws://{voxgate_server}/tts/websocket",
                                 settings=CartesiaTTSService.Settings(voice="joe"))  # fmt: skip
    rig = _rig(tts)

    async def script(rig: Rig) -> None:
        for _ in range(2):  # two turns on one socket
            await rig.reply(SHORT)
            await until(lambda: words(rig.assistant_text()).count(words(SHORT)[-1]) >= 1, 40)

    await rig.run(script)
    assert rig.speaker.played_s > 1.5
    assert words(rig.assistant_text())[: len(words(SHORT))] == words(SHORT)
