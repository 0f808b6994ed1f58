"""espeak-ng 1.52 (as shipped in the `espeakng-loader` wheel) as an IPA phonemiser, through ctypes.

libespeak-ng keeps process-global state and is not thread-safe, so one process-wide `Espeak` owns
the library on one dedicated thread; other threads submit texts and wait for the phonemes (a clause
takes well under a millisecond). espeak-ng is GPL-3.0-or-later: see docs/cpu_voices.md.
"""

from __future__ import annotations

import ctypes
import re
import threading
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor

from engine.words import word_spans

# espeak-ng's C API values (speak_lib.h), facts not knobs: espeak_AUDIO_OUTPUT's AUDIO_OUTPUT_SYNCHRONOUS,
# espeakCHARS_UTF8, and espeakPHONEMES_IPA (the phoneme mode for IPA output).
_AUDIO_OUTPUT_SYNCHRONOUS = 0x02
_CHARS_UTF8 = 1
_PHONEMES_IPA = 0x02
# espeak marks a switch of language inside a clause as "(en)"; the voice models know no such symbol.
_LANG_SWITCH = re.compile(r"\([a-z]{2,3}(?:-[a-z0-9]+)*\)")
# A clause ends at a mark followed by a space or the end; so "3.14", "e.g" and "1,000" stay whole.
# What espeak reads in a pinned word's place: one plain, stressed syllable, one token.
_STAND_IN = "thing"
_CLAUSE = re.compile(r"(.+?)([.,;:!?…]+[\"')\]]*)(?=\s|$)|(.+?)$", re.S)


class Pinned:
    """Words whose phonemes are given (a tenant lexicon's IPA entries, `StreamRequest.phonemes`): espeak
    never reads them; their IPA is spliced into the clause's phonemes in their place, as one token, so
    the word keeps its timing (engine/cpu/timings.py). A word of the text (engine/words.py) matches an
    entry in lower case in any case, one with a capital only as written (the gateway's lexicon rule)."""

    def __init__(self, phonemes: Mapping[str, str]) -> None:
        self._exact = {w: p for w, p in phonemes.items() if any(c.isupper() for c in w)}
        self._folded = {w.casefold(): p for w, p in phonemes.items() if not any(c.isupper() for c in w)}

    def get(self, word: str) -> str | None:
        found = self._exact.get(word)
        return found if found is not None else self._folded.get(word.casefold())


class Espeak:
    """The process-wide espeak-ng phonemiser. Use `Espeak.shared()`."""

    _instance: Espeak | None = None
    _instance_lock = threading.Lock()

    @classmethod
    def shared(cls) -> Espeak:
        with cls._instance_lock:
            if cls._instance is None:
                cls._instance = cls()
            return cls._instance

    def __init__(self) -> None:
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="espeak")
        self._voice: bytes | None = None
        self._lib: ctypes.CDLL | None = None
        self.version: str = self._thread.submit(self._init).result()

    def _init(self) -> str:
        import espeakng_loader  # lazily: only CPU voices need it

        lib = ctypes.CDLL(espeakng_loader.get_library_path())
        lib.espeak_Initialize.restype = ctypes.c_int
        lib.espeak_Initialize.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_char_p, ctypes.c_int]
        lib.espeak_SetVoiceByName.restype = ctypes.c_int
        lib.espeak_SetVoiceByName.argtypes = [ctypes.c_char_p]
        lib.espeak_TextToPhonemes.restype = ctypes.c_char_p
        lib.espeak_TextToPhonemes.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_int, ctypes.c_int]
        lib.espeak_Info.restype = ctypes.c_char_p
        lib.espeak_Info.argtypes = [ctypes.c_void_p]
        data = espeakng_loader.get_data_path().encode()
        if lib.espeak_Initialize(_AUDIO_OUTPUT_SYNCHRONOUS, 0, data, 0) <= 0:
            raise RuntimeError(f"espeak-ng failed to initialise with data at {data.decode()}")
        self._lib = lib
        return (lib.espeak_Info(None) or b"?").decode()

    def phonemize(self, text: str, voice: str = "en-us", pinned: Pinned | None = None) -> str:
        """IPA for `text` with punctuation kept: "Hi, there." → "hˈaɪ, ðˈɛɹ."

        espeak's phoneme API drops punctuation, which Piper and Kokoro use for prosody, so the text is
        cut into clauses here and each clause's closing mark is put back after its phonemes. `pinned`:
        words whose IPA is given, put in as they are (espeak's own `[[…]]` input takes its phoneme
        mnemonics, not IPA, so the clause is read around them instead).
        """
        return self._thread.submit(self._phonemize, text, voice, pinned).result()

    def _phonemize(self, text: str, voice: str, pinned: Pinned | None = None) -> str:
        assert self._lib is not None
        vb = voice.encode()
        if vb != self._voice:
            if self._lib.espeak_SetVoiceByName(vb) != 0:
                raise ValueError(f"espeak-ng has no voice {voice!r}")
            self._voice = vb
        out: list[str] = []
        for m in _CLAUSE.finditer(text.strip()):
            words, mark = (m.group(1), m.group(2)) if m.group(1) is not None else (m.group(3), "")
            ipa = self._pinned_clause(words, pinned) if words and words.strip() else ""
            piece = ipa + _mark(mark)
            if piece:
                out.append(piece)
        return " ".join(out)

    def _pinned_clause(self, text: str, pinned: Pinned | None) -> str:
        """A clause's phonemes, the pinned words' IPA in their places and espeak reading the rest."""
        spans = word_spans(text) if pinned is not None else []
        given = {i: ipa for i, (a, b) in enumerate(spans) if pinned is not None and (ipa := pinned.get(text[a:b]))}
        if not given:
            return self._clause(text)
        # Read whole, a plain noun standing in for each pinned word, so the words around it keep the
        # clause's prosody (read apart, "Welcome to" ends a clause and its "to" is stressed); where
        # espeak gives one token per word, as it almost always does, the stand-ins' tokens are swapped.
        stood_in, at = [], 0
        for i in given:
            stood_in += [text[at : spans[i][0]], _STAND_IN]
            at = spans[i][1]
        tokens = self._clause("".join(stood_in) + text[at:]).split()
        if len(tokens) == len(spans):
            return " ".join(given.get(i, token) for i, token in enumerate(tokens))
        parts: list[str] = []  # else read around them: the pieces between apart
        at = 0
        for i, ipa in given.items():
            start, end = spans[i]
            if text[at:start].strip():
                parts.append(self._clause(text[at:start]))
            parts.append(ipa)
            at = end
        if text[at:].strip():
            parts.append(self._clause(text[at:]))
        return " ".join(p for p in parts if p)

    def _clause(self, text: str) -> str:
        assert self._lib is not None
        buf = ctypes.create_string_buffer(text.encode())
        ptr = ctypes.c_void_p(ctypes.addressof(buf))
        parts: list[str] = []
        # espeak advances the pointer one clause per call and sets it to NULL at the end.
        while ptr.value:
            res = self._lib.espeak_TextToPhonemes(ctypes.byref(ptr), _CHARS_UTF8, _PHONEMES_IPA)
            if res:
                parts.append(res.decode("utf-8", "replace").strip())
        return _LANG_SWITCH.sub("", " ".join(p for p in parts if p))


def _mark(mark: str) -> str:
    """The one punctuation symbol the voice models know for a clause's closing marks."""
    for ch in mark:
        if ch in ".,;:!?":
            return ch
        if ch == "…":
            return "…"
    return ""
