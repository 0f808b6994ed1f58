"""Serving Qwen3-TTS: the engine core's thread and its streams (core, core_stream, text_track), the
scheduling policy (scheduler), the talker seam (talker_backend, slots, graphs) and the `Engine` the
gateway drives (qwen3_engine). docs/engine.md describes them."""
