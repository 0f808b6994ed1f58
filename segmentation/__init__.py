"""Streaming text segmentation: when is text from an LLM safe to speak (early enough for a prompt first audio, late
enough that a committed segment needs no later text to be said right)."""

from segmentation.jieba_pysbd import warm_up
from segmentation.normalize import UtteranceLanguage, normalize_for_speech
from segmentation.segment import GRANULARITIES, Segment, SegmentPolicy
from segmentation.segmenter import StreamSegmenter

__all__ = [
    "GRANULARITIES",
    "Segment",
    "SegmentPolicy",
    "StreamSegmenter",
    "UtteranceLanguage",
    "normalize_for_speech",
    "warm_up",
]
