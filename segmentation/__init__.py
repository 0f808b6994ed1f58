"""Streaming text segmentation: when is text from an LLM safe to speak (DESIGN §2)."""

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
