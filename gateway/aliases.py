"""The names clients bring, resolved to what this gateway serves: model ids and voice names.

Clients written for another service send that service's names: OpenAI's SDKs `tts-1` and `alloy`,
vLLM-Omni's clients and harnesses `Qwen/Qwen3-TTS-12Hz-1.7B-CustomVoice` and Qwen3-TTS's speakers
(`Vivian`, `Ryan`, …). Each name is resolved the same way on every route, HTTP and WebSocket:

Voices (`Aliases.voice`), first that applies:
  1. no name, "" → the engine's language-aware default (None);
  2. the `voice_aliases` table (the operator's; exact, then any case) → its target;
  3. a voice the served engine has (any case: a Qwen3 CustomVoice model speaks its own `Vivian`);
  4. a shipped alias (any case: OpenAI's voice names, Qwen3-TTS's speakers) → the engine's
     language-aware default;
  5. the name as it is: a voice the tenant registered, else the engine's `unknown_voice`.

Models (`Aliases.model`), first that applies:
  1. no name, "" → the default model;
  2. a served model of that name (then `default` and `voxgate`, the field's default → the default model);
  3. the `model_aliases` table (exact, then any case) → its target;
  4. a served model of that name in any case, or of the id's last part (`Qwen/Qwen3-TTS-12Hz-0.6B-Base`
     → a model served as `Qwen3-TTS-12Hz-0.6B-Base`, which is what a checkpoint directory is named);
  5. a shipped alias (OpenAI's model ids → the default model; a Qwen3-TTS id → the
     first served Qwen3 model of its variant, else the first Qwen3 model, else the default);
  6. none: `unknown_model` (404).

`shipped_aliases = false` turns steps 4 of voices and 5 of models off: only the tables and the served
names are then known. Shipped aliases never change what a name that the engine has means: a model or
voice of that name always wins over them, and a capability the name implies but the model lacks (a
Base id's cloning, a VoiceDesign id's instructions) is refused where it is asked for
(gateway/voices.py `refuse_missing_capability`), never served as something else.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Protocol

# Every voice name the `openai` package's `speech.create` types (its `voice` Literal) and Pipecat's
# OpenAITTSService accept.
OPENAI_VOICES = ("alloy", "ash", "ballad", "cedar", "coral", "echo", "fable", "marin", "nova", "onyx", "sage",
                 "shimmer", "verse")  # fmt: skip
# Qwen3-TTS CustomVoice's speakers (its config's spk_id), which vLLM-Omni's clients default to (Vivian).
QWEN3_SPEAKERS = ("vivian", "serena", "uncle_fu", "dylan", "eric", "ryan", "aiden", "ono_anna", "sohee")
OPENAI_MODELS = ("tts-1", "tts-1-hd", "gpt-4o-mini-tts")
# The Qwen3-TTS checkpoints on the Hub, as vLLM-Omni's clients name them (`Qwen/…`; the bare id too).
QWEN3_MODELS = tuple(f"Qwen3-TTS-12Hz-{size}-{variant}" for size in ("0.6B", "1.7B")
                     for variant in ("CustomVoice", "Base", "VoiceDesign"))  # fmt: skip
DEFAULT = "default"  # an alias's target meaning the engine's (or gateway's) default


class ModelSource(Protocol):
    """What model resolution reads of a served model (gateway/models.py ModelSpec)."""

    name: str

    @property
    def source(self) -> str: ...


class AliasSettings(Protocol):
    """The settings that configure aliases (gateway/settings.py Settings)."""

    voice_aliases: Mapping[str, str]
    model_aliases: Mapping[str, str]
    shipped_aliases: bool


def shipped_voice_aliases() -> dict[str, str]:
    return dict.fromkeys((*OPENAI_VOICES, *QWEN3_SPEAKERS), DEFAULT)


def shipped_model_aliases() -> dict[str, str]:
    names = (*OPENAI_MODELS, *QWEN3_MODELS, *(f"Qwen/{m}" for m in QWEN3_MODELS))
    return dict.fromkeys(names, DEFAULT)


def _folded(table: Mapping[str, str]) -> dict[str, str]:
    return {k.casefold(): v for k, v in table.items()}


class Aliases:
    """The configured tables (settings `voice_aliases`, `model_aliases`) and whether the shipped ones
    apply (`shipped_aliases`). Pure: what the engine and registry serve is passed in."""

    __slots__ = (
        "_models_folded",
        "_shipped_models",
        "_shipped_voices",
        "_voices_folded",
        "models",
        "shipped",
        "voices",
    )  # fmt: skip

    def __init__(self, voices: Mapping[str, str] | None = None, models: Mapping[str, str] | None = None,
                 shipped: bool = True) -> None:  # fmt: skip
        self.voices, self.models, self.shipped = dict(voices or {}), dict(models or {}), shipped
        self._voices_folded, self._models_folded = _folded(self.voices), _folded(self.models)
        self._shipped_voices = _folded(shipped_voice_aliases()) if shipped else {}
        self._shipped_models = _folded(shipped_model_aliases()) if shipped else {}

    @classmethod
    def of(cls, settings: AliasSettings) -> Aliases:
        return cls(settings.voice_aliases, settings.model_aliases, settings.shipped_aliases)

    # -- voices ---------------------------------------------------------------------------------------

    def voice(self, name: str | None, engine_voices: Collection[str]) -> str | None:
        """The voice `name` stands for on an engine with `engine_voices` (the module's order); None: the
        engine's language-aware default."""
        if name is None or not name.strip():
            return None
        target = self.voices.get(name) or self._voices_folded.get(name.casefold())
        if target is not None:
            return None if target == DEFAULT else target
        folded = name.casefold()
        if (own := next((v for v in engine_voices if v.casefold() == folded), None)) is not None:
            return own  # as the engine spells it ("Vivian" → "vivian")
        if folded in self._shipped_voices:
            return None
        return name

    def voice_table(self) -> dict[str, str]:
        """Every voice alias in force (GET /v1/audio/voices `aliases`): the shipped ones, the table's over them."""
        return (shipped_voice_aliases() if self.shipped else {}) | dict(self.voices)

    def reserved_voice_names(self) -> set[str]:
        """Casefolded names resolved before registered voices: a voice registered under one would never
        be used."""
        return {n.casefold() for n in self.voice_table()}

    # -- models ---------------------------------------------------------------------------------------

    def model(self, name: str | None, served: Collection[ModelSource], default: str) -> str | None:
        """The served model's name `name` stands for (the module's order); None: no such model."""
        key = (name or "").strip()
        names = {m.name for m in served}
        if not key:
            return default
        if key in names:
            return key
        if key.casefold() in (DEFAULT, "voxgate"):  # our own names for the default, never switched off
            return default
        target = self.models.get(key) or self._models_folded.get(key.casefold())
        if target is not None:
            return default if target == DEFAULT else target
        by_fold = {n.casefold(): n for n in names}
        for candidate in (key, key.rsplit("/", 1)[-1]):
            if candidate.casefold() in by_fold:
                return by_fold[candidate.casefold()]
        folded = key.casefold()
        if folded not in self._shipped_models:
            return None
        if "qwen3-tts" in folded:
            return _qwen3_model(folded, served) or default
        return default

    def model_table(self) -> dict[str, str]:
        return (shipped_model_aliases() if self.shipped else {}) | dict(self.models)


def _qwen3_model(folded_id: str, served: Collection[ModelSource]) -> str | None:
    """The first served Qwen3 model of the id's variant (CustomVoice, Base, VoiceDesign), else the first
    Qwen3 model: what a checkpoint's path or kind says (`…/Qwen3-TTS-12Hz-0.6B-Base`, `qwen3`)."""
    variant = folded_id.rsplit("-", 1)[-1]
    qwen = [m for m in served if "qwen3" in m.source.casefold()]
    same = [m for m in qwen if m.source.casefold().replace("_", "").endswith(variant)]
    chosen = same or qwen
    return chosen[0].name if chosen else None


SHIPPED = Aliases()  # the shipped aliases alone: what a caller given no settings resolves with
