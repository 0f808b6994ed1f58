"""Streaming text segmentation: when is text from an LLM safe to speak (DESIGN §2)."""

from segmentation.normalize import UtteranceLanguage, normalize_for_speech
from segmentation.segmenter import GRANULARITIES, Segment, SegmentPolicy, StreamSegmenter, warm_up

__all__ = [
    "GRANULARITIES",
    "Segment",
    "SegmentPolicy",
    "StreamSegmenter",
    "UtteranceLanguage",
    "normalize_for_speech",
    "warm_up",
]
