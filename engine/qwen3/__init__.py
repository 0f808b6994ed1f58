"""Qwen3-TTS 12Hz in PyTorch: config, loader, talker, code predictor, sampling, exact streaming codec.

    model = load_model(path)                       # a checkpoint directory (or make_tiny_checkpoint(path))
    codes = model.generate("Hello.", voice="ryan", language="english", greedy=True, max_frames=50)
    wav = model.decode(codes)                      # or model.stream_decoder().step(chunk) chunk by chunk
"""

from engine.qwen3.codec import CodecDecoder, CodecState
from engine.qwen3.config import ConfigError, Qwen3TTSConfig, SpeechTokenizerConfig, load_configs, real_config
from engine.qwen3.model import GenerationRequest, Qwen3TTSModel, SamplingParams, StreamDecoder, load_model
from engine.qwen3.prompt import Prompt, VoiceClone
from engine.qwen3.tiny import make_tiny_checkpoint
from engine.qwen3.weights import CheckpointError

__all__ = [
    "CheckpointError", "CodecDecoder", "CodecState", "ConfigError", "GenerationRequest", "Prompt",
    "Qwen3TTSConfig", "Qwen3TTSModel", "SamplingParams", "SpeechTokenizerConfig", "StreamDecoder", "VoiceClone",
    "load_configs", "load_model", "make_tiny_checkpoint", "real_config",
]
