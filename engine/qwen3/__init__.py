"""Qwen3-TTS 12Hz in PyTorch: config, loader, talker, code predictor, sampling, exact streaming codec.

Model level (one request at a time, offline):

    model = load_model(path)                       # a checkpoint directory (or make_tiny_checkpoint(path))
    codes = model.generate("Hello.", voice="ryan", language="english", greedy=True, max_frames=50)
    wav = model.decode(codes)                      # or model.stream_decoder().step(chunk) chunk by chunk

Engine level (what a continuous-batching core drives; generate.py's generate_batch is the reference loop):

    prompt = model.build_prompt(text, voice=..., language=..., streaming_text=True, final=False)
    more = model.prompts.text_rows(model.tokenizer.content_ids(segment)); end = model.prompts.eos_row()
    cache = model.new_kv_cache(slots, max_len)                       # static [layers, slots, kv, len, dim]
    logits, hidden = model.talker.prefill(rows[B,T,H], lengths[B], slots[B], cache)
    cb0 = generate.choose_cb0(model, logits, seen[B,V], n_generated[B], params)  # penalty, suppression
    frames = generate.complete_frames(model, hidden[B,H], cb0[B], params)       # code predictor → [B, 16]
    x = generate.next_inputs(model, frames, text_rows[B,H])                     # Σ16 embeddings + text row
    logits, hidden = model.talker.step(x, positions[B], slots[B], cache)
    state = model.codec.new_state(n); wav = model.codec.step(codes[b,16,k], state.rows(idx)) ...
"""

from engine.qwen3.codec import CodecDecoder, CodecState
from engine.qwen3.config import ConfigError, Qwen3TTSConfig, SpeechTokenizerConfig, load_configs, real_config
from engine.qwen3.generate import GenerationRequest, SamplingParams
from engine.qwen3.model import Qwen3TTSModel, StreamDecoder, load_model
from engine.qwen3.prompt import Prompt, VoiceClone
from engine.qwen3.tiny import make_tiny_checkpoint
from engine.qwen3.weights import CheckpointError

__all__ = [
    "CheckpointError", "CodecDecoder", "CodecState", "ConfigError", "GenerationRequest", "Prompt",
    "Qwen3TTSConfig", "Qwen3TTSModel", "SamplingParams", "SpeechTokenizerConfig", "StreamDecoder", "VoiceClone",
    "load_configs", "load_model", "make_tiny_checkpoint", "real_config",
]
