"""The resolver order of model ids and voice names (gateway/aliases.py), pure."""

from __future__ import annotations

from gateway.aliases import Aliases
from gateway.settings import ModelSpec, load_settings

SERVED = [ModelSpec(name="cpu", kind="cpu"), ModelSpec(name="qwen-base", path="/m/Qwen3-TTS-12Hz-0.6B-Base"),
          ModelSpec(name="qwen", path="/m/Qwen3-TTS-12Hz-1.7B-CustomVoice")]  # fmt: skip


def test_voice_order_table_then_engine_then_shipped_then_as_is() -> None:
    a = Aliases(voices={"Vivian": "joe", "narrator": "default"})
    assert a.voice("Vivian", ["vivian"]) == "joe"  # the operator's table wins over the engine's own
    assert a.voice("NARRATOR", []) is None  # any case; "default" is the engine's default
    assert Aliases().voice("Vivian", ["vivian", "ryan"]) == "vivian"  # the engine's own, as it spells it
    assert Aliases().voice("Ryan", ["joe"]) is None  # a shipped name: the language-aware default
    assert Aliases().voice("ALLOY", ["joe"]) is None
    assert Aliases().voice("my-clone", ["joe"]) == "my-clone"  # a registered voice, or unknown_voice
    assert Aliases(shipped=False).voice("Ryan", ["joe"]) == "Ryan"
    assert Aliases().voice(None, []) is None and Aliases().voice(" ", []) is None


def test_model_order_served_then_table_then_case_then_shipped() -> None:
    a = Aliases(models={"house": "qwen", "tts-1": "cpu"})
    assert a.model(None, SERVED, "cpu") == "cpu" and a.model("default", SERVED, "cpu") == "cpu"
    assert a.model("qwen", SERVED, "cpu") == "qwen"
    assert a.model("HOUSE", SERVED, "cpu") == "qwen"
    assert a.model("QWEN-BASE", SERVED, "cpu") == "qwen-base"
    assert Aliases().model("Qwen/Qwen3-TTS-12Hz-0.6B-Base", SERVED, "cpu") == "qwen-base"  # the variant served
    assert Aliases().model("Qwen/Qwen3-TTS-12Hz-1.7B-CustomVoice", SERVED, "cpu") == "qwen"
    assert Aliases().model("Qwen/Qwen3-TTS-12Hz-1.7B-VoiceDesign", SERVED, "cpu") == "qwen-base"  # a Qwen3 model
    assert Aliases().model("Qwen/Qwen3-TTS-12Hz-1.7B-VoiceDesign", SERVED[:1], "cpu") == "cpu"  # none: the default
    assert Aliases().model("tts-1-hd", SERVED, "cpu") == "cpu"
    assert Aliases().model("gpt-5", SERVED, "cpu") is None
    assert Aliases(shipped=False).model("tts-1", SERVED, "cpu") is None


def test_reserved_names_follow_the_shipped_setting() -> None:
    assert {"alloy", "ono_anna"} <= Aliases().reserved_voice_names()
    assert Aliases(voices={"Host": "joe"}, shipped=False).reserved_voice_names() == {"host"}


def test_settings_configure_the_tables_and_the_shipped_switch(tmp_path: object) -> None:
    s = load_settings(None, env={"VOXGATE_SHIPPED_ALIASES": "false"}, voice_aliases={"Ryan": "joe"})
    a = Aliases.of(s)
    assert not a.shipped and a.voice("ryan", []) == "joe"
