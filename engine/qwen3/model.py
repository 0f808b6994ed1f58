"""Qwen3TTSModel: a loaded checkpoint — config, modules, tokenizer, prompts, codec — and `load_model`.
How the modules are driven to generate lives in generate.py (gpt-fast's model.py / generate.py split): its
functions take the model first; the model keeps only `generate`, one whole request (tests and offline use).

The primitives (the engine core's talker backends build on them; `generate.generate_batch` is their
reference composition):
- `prompts.build(...) -> Prompt` — prefill rows + trailing text queue for one request;
- `talker.prefill(embeds[B,T,H], lengths[B], slots[B], cache)` / `talker.step(x[B,H], positions[B], slots[B],
  cache)` — codebook-0 logits and hidden states, against a slot-indexed static KV cache;
- `generate.choose_cb0(model, logits, seen, n_generated, params)` — penalty, suppression, min-new-tokens,
  sampling;
- `generate.complete_frames(model, hidden[B,H], cb0[B], params)` — the code predictor, batched: [B, 16];
- `generate.next_inputs(model, frames[B,16], text_rows[B,H])` — the talker's next input rows;
- `codec.new_state(B)` / `codec.step(codes[B,16,n], state)` — exact streaming decode.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from engine.qwen3 import generate, sampling
from engine.qwen3.code_predictor import CodePredictor
from engine.qwen3.codec import CodecDecoder, CodecState, CodecTransformer
from engine.qwen3.config import GenerationDefaults, Qwen3TTSConfig, SpeechTokenizerConfig, load_configs
from engine.qwen3.layers import DecoderStack, KVCache, rope_inv_freq
from engine.qwen3.mimi import MimiEncoder, load_encoder, resample_to_24k
from engine.qwen3.prompt import Prompt, PromptBuilder, VoiceClone
from engine.qwen3.speaker_encoder import SpeakerEncoder
from engine.qwen3.talker import Talker
from engine.qwen3.text import TextTokenizer
from engine.qwen3.weights import check_routed, load_module, read_tensors


class Qwen3TTSModel:
    FULL_DECODE_FRAMES = 300  # longer `decode` inputs are decoded in exact streaming blocks of this size
    def __init__(self, cfg: Qwen3TTSConfig, codec_cfg: SpeechTokenizerConfig, gen: GenerationDefaults,
                 talker: Talker, predictor: CodePredictor, codec: CodecDecoder, tokenizer: TextTokenizer,
                 speaker_encoder: SpeakerEncoder | None = None, codec_encoder: MimiEncoder | None = None) -> None:
        self.cfg, self.codec_cfg, self.gen = cfg, codec_cfg, gen
        self.talker, self.predictor, self.codec, self.tokenizer = talker, predictor, codec, tokenizer
        self.speaker_encoder = speaker_encoder
        self.codec_encoder = codec_encoder  # Mimi: reference audio → ICL codes (Base checkpoints)
        self.prompts = PromptBuilder(cfg, talker, predictor)
        tc = cfg.talker_config
        self.eos_id = tc.codec_eos_token_id
        self.suppress_mask = sampling.control_id_mask(tc.vocab_size, self.eos_id).to(self.device)
        self._predictor_cache: KVCache | None = None

    # ---- facts -------------------------------------------------------------------------------------
    @property
    def device(self) -> torch.device:
        return self.talker.codec_head.weight.device

    @property
    def speakers(self) -> list[str]:
        return list(self.cfg.talker_config.spk_id)

    @property
    def languages(self) -> list[str]:
        return self.prompts.languages()

    @property
    def sample_rate(self) -> int:
        return self.codec_cfg.output_sample_rate

    @property
    def samples_per_frame(self) -> int:
        return self.codec.samples_per_frame

    @property
    def model_type(self) -> str:
        return self.cfg.tts_model_type

    # ---- prompts -----------------------------------------------------------------------------------
    def build_prompt(self, text: str | Sequence[int], *, voice: str | VoiceClone | None, language: str = "auto",
                     instructions: str | None = None, streaming_text: bool = True, final: bool = True) -> Prompt:
        """The prompt for `text`, or for its content ids as `TextTokenizer.content_ids` gives them (the
        engine tokenizes streamed pieces itself)."""
        kind, tok = self.cfg.tts_model_type, self.tokenizer
        speaker, clone = None, None
        if kind == "base":
            if not isinstance(voice, VoiceClone):
                raise ValueError("a Base checkpoint needs a VoiceClone voice (x-vector, optional ICL reference)")
            clone, instructions = voice, None  # the reference's voice-clone path takes no instruction
        elif isinstance(voice, VoiceClone):
            raise ValueError(f"a {kind} checkpoint cannot clone voices")
        elif kind == "custom_voice":
            speaker = voice or self.speakers[0]
            if self.cfg.tts_model_size == "0b6":
                instructions = None  # the reference drops instructions for the 0.6B CustomVoice model
        elif voice:
            raise ValueError(f"a voice_design checkpoint has no named voices (got {voice!r}); use instructions")
        ids = tok.content_ids(text) if isinstance(text, str) else list(text)
        return self.prompts.build(
            ids, role_ids=tok.role_ids(), language=language, speaker=speaker, clone=clone,
            clone_ref_ids=tok.ref_ids(clone.ref_text) if clone is not None and clone.icl else None,
            instruct_ids=tok.instruct_ids(instructions) if instructions else None,
            streaming_text=streaming_text, final=final,
        )

    def clone_voice(self, wav: np.ndarray, sample_rate: int = 24000, *, ref_text: str | None = None,
                    ref_codes: np.ndarray | torch.Tensor | None = None) -> VoiceClone:
        """A Base-model voice from reference audio: its x-vector, plus — for ICL — the transcript and the
        reference's codec frames [R, 16]: `ref_codes` if given, else encoded from `wav` when `ref_text` is."""
        if self.speaker_encoder is None:
            raise ValueError(f"a {self.cfg.tts_model_type} checkpoint has no speaker encoder (Base models only)")
        audio = np.asarray(wav, dtype=np.float32)
        if audio.ndim != 1:
            raise ValueError("reference audio must be mono [samples]")
        audio = resample_to_24k(audio, sample_rate)
        xvec = self.speaker_encoder.embed(audio).to(self.talker.codec_head.weight.dtype)
        if ref_codes is None and ref_text and self.codec_encoder is not None:
            ref_codes = self.encode_reference(audio)
        codes = None if ref_codes is None else torch.as_tensor(np.asarray(ref_codes), dtype=torch.long)
        return VoiceClone(xvec, ref_text=ref_text, ref_codes=codes)

    def encode_reference(self, wav: np.ndarray, sample_rate: int = 24000) -> np.ndarray:
        """Reference audio (mono, any rate) → its codec frames [ceil(seconds · 12.5), 16] int64, as the
        official speech tokenizer's `encode` gives them (same resampling, same codes)."""
        if self.codec_encoder is None:
            raise ValueError(f"this {self.cfg.tts_model_type} checkpoint has no speech-tokenizer encoder loaded "
                             "(Base checkpoints only)")
        audio = np.asarray(wav, dtype=np.float32)
        if audio.ndim != 1:
            raise ValueError("reference audio must be mono [samples]")
        return self.codec_encoder.encode(resample_to_24k(audio, sample_rate)).cpu().numpy()

    # ---- generation primitives ---------------------------------------------------------------------
    def new_kv_cache(self, slots: int, max_len: int) -> KVCache:
        return self.talker.new_cache(slots, max_len)

    def predictor_cache(self, rows: int) -> KVCache:
        """The code predictor's cache for at least `rows` rows (grown, never shrunk)."""
        if self._predictor_cache is None or self._predictor_cache.slots < rows:
            self._predictor_cache = self.predictor.new_cache(max(rows, 8))
        return self._predictor_cache

    def generate(self, text: str, *, voice: str | VoiceClone | None = None, language: str = "auto",
                 instructions: str | None = None, greedy: bool = False, seed: int | None = None,
                 max_frames: int | None = None, streaming_text: bool = True) -> np.ndarray:
        """Codes [frames, 16] (int64) for one utterance; EOS may stop before `max_frames`."""
        return generate.generate(self, text, voice=voice, language=language, instructions=instructions,
                                 greedy=greedy, seed=seed, max_frames=max_frames, streaming_text=streaming_text)

    # ---- codec -------------------------------------------------------------------------------------
    @torch.no_grad()
    def decode(self, codes: np.ndarray | torch.Tensor) -> np.ndarray:
        """Full decode: codes [frames, 16] → float32 waveform [frames · 1920] at 24 kHz."""
        c = torch.as_tensor(np.asarray(codes), dtype=torch.long, device=self.device)
        if c.ndim != 2 or c.shape[1] != 16:
            raise ValueError(f"codes must be [frames, 16], got {tuple(c.shape)}")
        if c.shape[0] == 0:
            return np.zeros(0, np.float32)
        if c.shape[0] <= self.FULL_DECODE_FRAMES:
            return self.codec(c.T[None])[0].float().cpu().numpy()
        # Long inputs go through the exact streaming path in blocks: same samples, bounded attention memory
        # (a one-shot pass would hold [heads, T, T] scores).
        state = self.codec.new_state(1)
        blocks = [self.codec.step(c[s:s + self.FULL_DECODE_FRAMES].T[None], state)[0]
                  for s in range(0, c.shape[0], self.FULL_DECODE_FRAMES)]
        return torch.cat(blocks).float().cpu().numpy()

    def stream_decoder(self) -> StreamDecoder:
        return StreamDecoder(self.codec)


class StreamDecoder:
    """Decodes one stream chunk by chunk; each `step` continues exactly where the previous one ended."""

    def __init__(self, codec: CodecDecoder) -> None:
        self.codec = codec
        self.state: CodecState = codec.new_state(1)

    @torch.no_grad()
    def step(self, codes_chunk: np.ndarray | torch.Tensor) -> np.ndarray:
        # A copy as int64: frames straight off the wire (np.frombuffer) are read-only, which torch warns about.
        codes = codes_chunk if isinstance(codes_chunk, torch.Tensor) else np.array(codes_chunk, dtype=np.int64)
        c = torch.as_tensor(codes, dtype=torch.long, device=self.state.pos.device)
        if c.ndim != 2 or c.shape[1] != 16:
            raise ValueError(f"codes must be [frames, 16], got {tuple(c.shape)}")
        if c.shape[0] == 0:
            return np.zeros(0, np.float32)
        return self.codec.step(c.T[None], self.state)[0].float().cpu().numpy()

    @property
    def frames(self) -> int:
        return int(self.state.pos[0])


def _materialize(module: torch.nn.Module) -> None:
    """Recompute non-persistent buffers (RoPE tables) of a module built on the meta device."""
    for m in module.modules():
        if isinstance(m, DecoderStack | CodecTransformer):
            m.inv_freq = rope_inv_freq(m.inv_freq.shape[0] * 2, m.rope_theta)


def load_model(path: str | Path, device: str | torch.device = "cpu", dtype: torch.dtype | None = None
               ) -> Qwen3TTSModel:
    """Load a Qwen3-TTS 12Hz checkpoint directory. Talker and predictor in `dtype` (default fp32 on CPU,
    bf16 elsewhere); the codec always in fp32."""
    root = Path(path)
    cfg, codec_cfg, gen = load_configs(root)
    if dtype is None:
        dtype = torch.float32 if torch.device(device).type == "cpu" else torch.bfloat16
    tc = cfg.talker_config
    with torch.device("meta"):  # no throwaway random init: every parameter comes from the files
        talker = Talker(tc)
        predictor = CodePredictor(tc.code_predictor_config, tc.hidden_size)
        codec = CodecDecoder(codec_cfg.decoder_config)
    speaker_encoder = SpeakerEncoder(cfg.speaker_encoder_config) if cfg.tts_model_type == "base" else None
    tensors = read_tensors(root)
    check_routed(tensors, ("talker.", "speaker_encoder.") if speaker_encoder else ("talker.",), (),
                 "model.safetensors")
    load_module(talker, tensors, "talker.", exclude=("talker.code_predictor.",), dtype=dtype, source=str(root))
    load_module(predictor, tensors, "talker.code_predictor.", dtype=dtype, source=str(root))
    if speaker_encoder is not None:
        load_module(speaker_encoder, tensors, "speaker_encoder.", dtype=torch.float32, source=str(root))
        speaker_encoder.to(device).eval().requires_grad_(False)
    del tensors
    codec_tensors = read_tensors(root / "speech_tokenizer")
    # The Mimi encoder only serves voice cloning: loaded for Base checkpoints, skipped otherwise.
    check_routed(codec_tensors, ("decoder.",), ("encoder.",), "speech_tokenizer/model.safetensors")
    codec_encoder = None
    if speaker_encoder is not None and any(name.startswith("encoder.") for name in codec_tensors):
        codec_encoder = load_encoder(codec_cfg, codec_tensors, str(root / "speech_tokenizer"), device)
    load_module(codec, codec_tensors, "decoder.", dtype=torch.float32, source=str(root / "speech_tokenizer"))
    for m in (talker, predictor, codec):
        _materialize(m)
    codec.refresh()
    for m in (talker, predictor, codec):  # inference only: no autograd bookkeeping in the primitives
        m.to(device).eval().requires_grad_(False)
    return Qwen3TTSModel(cfg, codec_cfg, gen, talker, predictor, codec, TextTokenizer.from_dir(root),
                         speaker_encoder, codec_encoder)
