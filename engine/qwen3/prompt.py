"""Prompt rows for the talker: every row is a text-track embedding plus a codec-track embedding.

Layout (reference `Qwen3TTSForConditionalGeneration.generate`):

    [instruct turn, text-only]                                  VoiceDesign / CustomVoice 1.7B
    <|im_start|> assistant \\n                                     text-only rows
    codec: think think_bos lang think_eos [speaker] pad  + text: tts_pad … tts_pad tts_bos
    (auto language: nothink think_bos think_eos)
    then, streaming text:      text[0] + codec_bos; trailing queue = text[1:] + tts_eos
          non-streaming text:  text[i] + codec_pad for all text and tts_eos, then tts_pad + codec_bos;
                               trailing queue empty
          Base ICL:            (ref_text ++ text ++ tts_eos) against (codec_bos ++ Σ16 ref-code embeddings)

During generation, step g's input is Σ embeddings of the previous frame's 16 codes + trailing[g], or
tts_pad once the queue is empty. A dialect speaker with chinese/auto language swaps in the dialect id.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.qwen3.code_predictor import CodePredictor
from engine.qwen3.config import Qwen3TTSConfig
from engine.qwen3.talker import Talker


@dataclass
class Prompt:
    rows: torch.Tensor  # [T, H] prefill rows
    trailing: torch.Tensor  # [N, H] text rows consumed one per generated frame
    pad: torch.Tensor  # [H] the tts_pad row used once `trailing` is exhausted
    ref_codes: torch.Tensor | None = None  # [R, 16] ICL reference frames (prime the codec with them)


@dataclass
class VoiceClone:
    """A Base-model voice: an x-vector (speaker encoder output, talker width), and for ICL the reference
    transcript and its codec frames."""

    speaker_embedding: torch.Tensor  # [H]
    ref_text: str | None = None
    ref_codes: torch.Tensor | None = None  # [R, 16]

    @property
    def icl(self) -> bool:
        return self.ref_codes is not None and bool(self.ref_text)


def frame_embedding(talker: Talker, predictor: CodePredictor, codes: torch.Tensor) -> torch.Tensor:
    """Σ of the 16 codebook embeddings of frames codes [..., 16] → [..., H] (talker table for cb0)."""
    parts = [talker.codec_rows(codes[..., 0]), *predictor.embed_codes(codes[..., 1:])]
    return torch.stack(parts, dim=-2).sum(-2)  # stack-then-sum: the reference's summation order


class PromptBuilder:
    def __init__(self, cfg: Qwen3TTSConfig, talker: Talker, predictor: CodePredictor) -> None:
        self.cfg, self.tc = cfg, cfg.talker_config
        self.talker, self.predictor = talker, predictor

    def _dev(self) -> torch.device:
        return self.talker.codec_head.weight.device

    def text_rows(self, ids: list[int]) -> torch.Tensor:
        """Projected text rows [n, H] (for appending live text to a request's trailing queue)."""
        with torch.no_grad():
            return self.talker.text_rows(torch.tensor(ids, dtype=torch.long, device=self._dev()))

    def eos_row(self) -> torch.Tensor:
        return self.text_rows([self.cfg.tts_eos_token_id])

    def codec_rows(self, ids: list[int]) -> torch.Tensor:
        with torch.no_grad():
            return self.talker.codec_rows(torch.tensor(ids, dtype=torch.long, device=self._dev()))

    def language_id(self, language: str, speaker: str | None) -> int | None:
        lang = language.lower()
        if lang != "auto" and lang not in self.tc.codec_language_id:
            raise ValueError(f"language {language!r} is not supported; use one of {self.languages()}")
        lang_id = None if lang == "auto" else self.tc.codec_language_id[lang]
        if speaker and lang in ("chinese", "auto") and (dialect := self.tc.speaker_dialect(speaker)):
            lang_id = self.tc.codec_language_id[dialect]
        return lang_id

    def languages(self) -> list[str]:
        return ["auto"] + [k for k in self.tc.codec_language_id if "dialect" not in k]

    def build(self, text_ids: list[int], *, role_ids: list[int], language: str = "auto",
              speaker: str | None = None, clone: VoiceClone | None = None, clone_ref_ids: list[int] | None = None,
              instruct_ids: list[int] | None = None, streaming_text: bool = True, final: bool = True) -> Prompt:
        """Prompt for content ids `text_ids` (see module doc). `final=False` leaves tts_eos off the
        trailing queue so live text can be appended (streaming-text mode only)."""
        if not text_ids:
            raise ValueError("the text is empty")
        if speaker is not None and speaker.lower() not in self.tc.spk_id:
            raise ValueError(f"speaker {speaker!r} is not in this checkpoint; use one of {sorted(self.tc.spk_id)}")
        with torch.no_grad():
            return self._build(text_ids, role_ids, language, speaker, clone, clone_ref_ids, instruct_ids,
                               streaming_text, final)

    def _build(self, text_ids: list[int], role_ids: list[int], language: str, speaker: str | None,
               clone: VoiceClone | None, clone_ref_ids: list[int] | None, instruct_ids: list[int] | None,
               streaming_text: bool, final: bool) -> Prompt:
        tc, cfg = self.tc, self.cfg
        tts_bos, tts_eos, tts_pad = self.text_rows(
            [cfg.tts_bos_token_id, cfg.tts_eos_token_id, cfg.tts_pad_token_id]
        ).unbind(0)
        lang_id = self.language_id(language, speaker)
        tag = ([tc.codec_nothink_id, tc.codec_think_bos_id, tc.codec_think_eos_id] if lang_id is None
               else [tc.codec_think_id, tc.codec_think_bos_id, lang_id, tc.codec_think_eos_id])
        codec = [self.codec_rows(tag)]
        if clone is not None:
            codec.append(clone.speaker_embedding.to(tts_pad)[None])
        elif speaker is not None:
            codec.append(self.codec_rows([tc.speaker_id(speaker)]))
        codec.append(self.codec_rows([tc.codec_pad_id, tc.codec_bos_id]))
        codec_track = torch.cat(codec)
        n = codec_track.shape[0]
        text_track = torch.cat([tts_pad.expand(n - 2, -1), tts_bos[None]])
        rows = []
        if instruct_ids:
            rows.append(self.text_rows(instruct_ids))
        rows += [self.text_rows(role_ids), text_track + codec_track[:-1]]
        codec_bos_row = codec_track[-1:]
        empty = tts_pad[:0][None].reshape(0, tts_pad.shape[0])
        ref_codes = None
        if clone is not None and clone.icl:
            assert clone.ref_codes is not None and clone_ref_ids is not None
            ref_codes = clone.ref_codes.to(device=self._dev(), dtype=torch.long)
            text = torch.cat([self.text_rows(clone_ref_ids + text_ids)] + ([tts_eos[None]] if final else []))
            codes = torch.cat([codec_bos_row, frame_embedding(self.talker, self.predictor, ref_codes)])
            # Live text (final=False) may only extend the trailing queue, so the text must already cover
            # the reference frames: then the prompt is the one the whole text would give.
            if not final and (not streaming_text or text.shape[0] < codes.shape[0]):
                raise ValueError(f"an ICL prompt before the end of the text needs streaming text and at least "
                                 f"{codes.shape[0]} transcript + text tokens, got {text.shape[0]}")
            if not streaming_text:
                pad_rows = self.codec_rows([tc.codec_pad_id]).expand(text.shape[0], -1)
                rows += [text + pad_rows, codes + tts_pad]
                trailing = empty
            elif text.shape[0] > codes.shape[0]:
                rows.append(text[: codes.shape[0]] + codes)
                trailing = text[codes.shape[0]:]
            else:
                pad_text = tts_pad.expand(codes.shape[0] - text.shape[0], -1)
                rows.append(torch.cat([text, pad_text]) + codes)
                trailing = empty
        elif streaming_text:
            rows.append(self.text_rows(text_ids[:1]) + codec_bos_row)
            tail = [self.text_rows(text_ids[1:])] if len(text_ids) > 1 else []
            trailing = torch.cat(tail + ([tts_eos[None]] if final else []) + [empty])
        else:
            if not final:
                raise ValueError("non-streaming text needs the whole text (final=True)")
            text = torch.cat([self.text_rows(text_ids), tts_eos[None]])
            rows += [text + self.codec_rows([tc.codec_pad_id]), tts_pad[None] + codec_bos_row]
            trailing = empty
        return Prompt(torch.cat(rows), trailing, tts_pad, ref_codes)
