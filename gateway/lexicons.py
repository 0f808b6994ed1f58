"""Pronunciation lexicons over HTTP, per tenant: `PUT/GET/DELETE /v1/lexicons/{name}`, `GET /v1/lexicons`.

A session speaks with one by naming it in `session.config` (`lexicon`), an HTTP speech request (and a
batch item) with its `lexicon` field; its respellings are applied to each committed segment before
normalisation (segmentation/lexicon.py), its IPA entries go to the engine as the stream's `phonemes`
(`spoken_with`). Stored in the session store (sessions/lexicon.py), so every replica uses the same.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import msgspec
from litestar import Response, delete, get, put
from litestar.di import NamedDependency
from litestar.params import FromPath, JSONBody

from engine import Engine, EngineError, StreamRequest
from engine.languages import HAN_RE
from engine.words import WORD
from gateway.errors import ApiError
from gateway.protocol import ProtocolError
from gateway.settings import Limits
from segmentation import StreamSegmenter, UtteranceLanguage, normalize_for_speech
from segmentation.lexicon import Pronunciations
from sessions import SessionStore, Tenant
from sessions.lexicon import (
    MAX_ENTRIES,
    MAX_IPA_CHARS,
    MAX_SAY_CHARS,
    MAX_WORD_CHARS,
    Lexicon,
    LexiconStore,
    first_invalid,
)

# The largest valid body: MAX_ENTRIES entries of the longest word, respelling and IPA, each character a
# 12-byte JSON escape (a surrogate pair), with room for the quotes, keys and separators.
MAX_BODY_BYTES = MAX_ENTRIES * (MAX_WORD_CHARS + MAX_SAY_CHARS + MAX_IPA_CHARS + 16) * 12 + 64 * 1024
NO_LEXICON = Pronunciations({})
# An HTTP request's text is segmented this many characters at a time, and segments longer than this are
# respelled and normalised off the event loop: gateway/intake.py's FEED_SLICE and NORMALIZE_INLINE_CHARS.
FEED_SLICE = 512
NORMALIZE_INLINE_CHARS = 1024


def ipa_entry_problem(word: str) -> str | None:
    """Why `word` cannot carry IPA, or None. The engine finds it among the words of the text it is given
    (engine/words.py) after normalisation, so it must be one such word, of a spaced script (espeak reads
    no Han), that the normaliser leaves as it is ("GPT4" becomes "GPT four": give it a respelling)."""
    if WORD.fullmatch(word) is None or HAN_RE.search(word):
        return "an IPA entry's word must be one word of letters and digits (not Han): use say for phrases"
    if normalize_for_speech(word, "en") != word:
        return f"the normaliser speaks {word[:64]!r} as other words, so IPA cannot be given for it: use say"
    return None


@dataclass
class Respelled:
    """The characters of one text (a WebSocket utterance, an HTTP request or batch item) sent and as
    respelled so far: the respellings may lengthen it to `growth` × sent + `slack`, no more
    (Limits.max_respelling_growth), so every bound on the text sent bounds the text spoken too."""

    growth: float
    slack: int
    sent: int = 0
    respelled: int = 0

    @classmethod
    def of(cls, limits: Limits) -> Respelled:
        return cls(limits.max_respelling_growth, limits.respelling_slack_chars)

    def charge(self, sent: int, respelled: int) -> None:
        """Count one segment; `respelling_too_long` (uncounted) past the bound."""
        total_sent, total = self.sent + sent, self.respelled + respelled
        if total > self.growth * total_sent + self.slack:
            raise ProtocolError(
                "respelling_too_long",
                f"the lexicon's respellings make {total_sent} characters sent {total} characters to speak: at "
                f"most {self.growth:g} × the text sent + {self.slack} may be spoken (max_respelling_growth)",
            )  # fmt: skip
        self.sent, self.respelled = total_sent, total


def spoken_text(pronunciations: Pronunciations, text: str, language: str, respelled: Respelled | None = None) -> str:
    """What the engine is given for a committed segment: the lexicon's respellings applied, then normalised
    (so a respelling is normalised too, and an entry matches the text as the client wrote it). Marks alone
    ("……", "?!") say nothing: "" (no engine stream is opened, nor admitted, for them; a sentence-mode
    client's lone "…" took its listener's second stream and the next sentence waited for a slot).
    `respelled`: the text's growth so far, charged (ProtocolError `respelling_too_long` past its bound)."""
    said = pronunciations.apply(text) if pronunciations else text
    if respelled is not None and pronunciations:
        respelled.charge(len(text), len(said))
    spoken = normalize_for_speech(said, language)
    return spoken if any(c.isalnum() for c in spoken) else ""


async def spoken_segments(text: str, language: str, pronunciations: Pronunciations, limits: Limits) -> list[str]:
    """An HTTP request's text as a WebSocket session's is spoken: segmented, respelled and normalised,
    segment by segment, yielding to the event loop between slices and segments (a long one off the loop,
    as gateway/intake.py does), so no request holds the loop. 400 `respelling_too_long` (param
    `lexicon`) when the respellings would lengthen it past Limits.max_respelling_growth."""
    segmenter, respelled = StreamSegmenter(language, "auto"), Respelled.of(limits)
    reading = UtteranceLanguage()  # a segment with no letters ("12.5%。") is read in the request's language
    spoken: list[str] = []
    try:
        for i in range(0, len(text) + 1, FEED_SLICE):
            last = i + FEED_SLICE > len(text)
            segments = segmenter.feed(text[i : i + FEED_SLICE]) + (segmenter.flush() if last else [])
            for seg in segments:
                read_as = reading.of(seg.text, language)
                if len(seg.text) > NORMALIZE_INLINE_CHARS:
                    said = await asyncio.to_thread(spoken_text, pronunciations, seg.text, read_as, respelled)
                else:
                    said = spoken_text(pronunciations, seg.text, read_as, respelled)
                if said:
                    spoken.append(said)
                await asyncio.sleep(0)
            await asyncio.sleep(0)
    except ProtocolError as e:
        raise ApiError(e.message, code=e.code, param="lexicon") from None
    return spoken


async def tenant_lexicon(store: SessionStore, tenant: Tenant, name: str | None) -> Lexicon | None:
    """The lexicon an HTTP speech request (or batch item) names, as the caller's tenant: None for none;
    a name the tenant has not put is OpenAI's 404 `unknown_lexicon`, naming the field."""
    if name is None:
        return None
    lexicon = await lexicons(store).get(tenant.name, name)  # a malformed name: 400 invalid_id
    if lexicon is None:
        raise ApiError(f"no lexicon {name[:128]!r} (PUT /v1/lexicons/{{name}} first)", code="unknown_lexicon",
                       status=404, param="lexicon")  # fmt: skip
    return lexicon


def _first_bad(words: Iterable[str]) -> tuple[str, str] | None:
    return next(((w, p) for w in words if (p := ipa_entry_problem(w)) is not None), None)


def spoken_with(engine: Engine, request: StreamRequest,
                lexicon: Lexicon | None) -> tuple[StreamRequest, Pronunciations]:  # fmt: skip
    """The engine's verdict on `request` spoken with `lexicon`: the request (with the IPA entries as its
    `phonemes`, for an engine that takes them) and the respellings to apply to the text. An engine that
    reads no phonemes (Qwen3) says each IPA entry's `say` instead; an entry with no `say` is then refused
    (`phonemes_unsupported`) rather than dropped. Blocking (engine.check): call it off the event loop."""
    if lexicon is None:
        engine.check(request)
        return request, NO_LEXICON
    respellings, ipa = lexicon.respellings(), lexicon.phonemes()
    if ipa:
        with_ipa = msgspec.structs.replace(request, phonemes=ipa)
        try:
            engine.check(with_ipa)
            return with_ipa, pronunciations({w: say for w, say in respellings.items() if w not in ipa})
        except EngineError as e:
            if e.code != "phonemes_unsupported":
                raise
            if bare := sorted(w for w in ipa if w not in respellings):
                shown = ", ".join(repr(w) for w in bare[:5])
                raise EngineError("phonemes_unsupported", f"{e}; the entries {shown} ({len(bare)} in all) "
                                  "have IPA only (add a say to each)") from None
    engine.check(request)
    return request, pronunciations(respellings)


@functools.lru_cache(maxsize=16)
def _compiled(respellings: tuple[tuple[str, str], ...]) -> Pronunciations:
    """One compiled matcher per distinct set of respellings, shared by the sessions and requests that
    speak with it: building one of 1000 long entries costs ~0.1 s (and a few MB), using it nothing."""
    return Pronunciations(dict(respellings))


def pronunciations(respellings: dict[str, str]) -> Pronunciations:
    return _compiled(tuple(respellings.items())) if respellings else NO_LEXICON


def lexicons(store: SessionStore) -> LexiconStore:
    return LexiconStore(store)  # cheap: its scripts are loaded into Redis on first use, by digest


@put("/v1/lexicons/{name:str}", status_code=200, request_max_body_size=MAX_BODY_BYTES)
async def put_lexicon(
    data: JSONBody[Lexicon], tenant: NamedDependency[Tenant], store: NamedDependency[SessionStore],
    name: FromPath[str],
) -> Response[dict[str, Any]]:
    # What the matcher can find (segmentation/lexicon.py): ~30 ms for 1000 long words, off the event loop.
    if (bad := await asyncio.to_thread(first_invalid, data)) is not None:
        raise ApiError(bad[1], code="invalid_lexicon_entry", param=f"entries.{bad[0][:64]}")
    # Normalising a word costs ~60 µs: the IPA entries' words (up to 1000) are checked off the event loop.
    if (ipa := data.phonemes()) and (bad := await asyncio.to_thread(_first_bad, ipa)):
        raise ApiError(bad[1], code="invalid_lexicon_entry", param=f"entries.{bad[0]}")
    await lexicons(store).put(tenant.name, name, data)
    return Response({"name": name, "entries": len(data.entries)})


@get("/v1/lexicons/{name:str}")
async def get_lexicon(
    tenant: NamedDependency[Tenant], store: NamedDependency[SessionStore], name: FromPath[str]
) -> Response[dict[str, Any]]:
    lexicon = await lexicons(store).get(tenant.name, name)
    if lexicon is None:
        raise ApiError(f"no lexicon {name[:128]!r}", code="lexicon_not_found", status=404)
    return Response({"name": name, "entries": lexicon.entries})


@get("/v1/lexicons")
async def list_lexicons(
    tenant: NamedDependency[Tenant], store: NamedDependency[SessionStore]
) -> Response[dict[str, Any]]:
    return Response({"lexicons": await lexicons(store).names(tenant.name)})


@delete("/v1/lexicons/{name:str}", status_code=200)
async def delete_lexicon(
    tenant: NamedDependency[Tenant], store: NamedDependency[SessionStore], name: FromPath[str]
) -> Response[dict[str, Any]]:
    if not await lexicons(store).delete(tenant.name, name):
        raise ApiError(f"no lexicon {name[:128]!r}", code="lexicon_not_found", status=404)
    return Response({"name": name, "deleted": True})


lexicon_routes = [put_lexicon, get_lexicon, list_lexicons, delete_lexicon]
