"""The `vllm.general_plugins` entry point (pyproject.toml): vLLM calls `register()` in every process it
starts, before it loads a model, so our architecture resolves there too. Lazy ("module:Class"): vLLM
imports the model module only when a config names it."""

from __future__ import annotations

ARCHITECTURE = "VoxgateTalkerForCausalLM"


def register() -> None:
    from vllm import ModelRegistry

    if ARCHITECTURE not in ModelRegistry.get_supported_archs():
        ModelRegistry.register_model(ARCHITECTURE, "engine.vllm_talker.model:VoxgateTalkerModel")
