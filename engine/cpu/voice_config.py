"""The CPU voices' rendering knobs: how text is cut into model runs, how loud a voice comes out, and how
word timings are read from a run's durations.

The scheduling knobs (when each piece runs, how big it is cut) are `CpuPolicyConfig`'s
(engine/cpu/policy.py); these are the ones that change what a model run is given or what its audio and
words look like. One frozen object, handed in (`CpuEngine(voice_config=...)`, then to each voice and
function that reads a knob), so a test or a bench can set one without touching a global.
"""

from __future__ import annotations

from dataclasses import dataclass, fields


@dataclass(frozen=True, slots=True)
class VoiceConfig:
    """Every tuned constant of the CPU voices' rendering, with its unit and why it has its value."""

    # Linear gain on Piper's audio. Piper joe comes out about 5 dB quieter than Kokoro (speech RMS 0.05
    # vs 0.09, peaks ≤ 0.42): a fixed gain keeps the level steady when a mixed-language stream switches
    # voice (no per-sentence normalising, which would pump the level from sentence to sentence).
    piper_gain: float = 1.8
    # Seconds Kokoro's word timings are moved earlier. Its audio runs ahead of its durations' grid (its
    # decoder sees the frames around each one): a voiced sound that opens an utterance begins 30–60 ms
    # (median 40) before its token's first frame, in English and Mandarin alike, and a forced aligner put
    # the words' starts 38 ms and ends 60 ms after where they are heard. Piper keeps to its grid (±8 ms).
    kokoro_ahead_s: float = 0.040
    # Syllables (Han characters, Latin words) a stream's first clause needs to go alone as its first
    # piece: "好的，" does, "好，" does not (one syllable is too short a model run to sound like speech).
    # As the segmenter's rule (`SegmentPolicy.first_clause_han`).
    first_clause_syllables: int = 2
    # Phoneme symbols in one Piper model run: VITS attention cost grows with length, so a longer sentence
    # is cut at clauses (then spaces) into runs of at most this many.
    piper_max_phonemes: int = 400
    # Tokens in one Kokoro model run (of the model's 510): a longer sentence is cut at clauses so first
    # audio comes sooner. On 2 cores 100 vs 240 cut Mandarin time-to-first-audio about 40 % for 2 long
    # segments (CER 0.14 vs 0.11).
    kokoro_max_tokens: int = 100
    # Word timings where espeak's phoneme tokens and the words differ in count (engine/cpu/timings.py):
    # words (or tokens) one alignment step may join, at most; a sentence's merges and splits span 2–3.
    align_most_per_step: int = 3
    # Penalty, in log length ratio, of a step that is not one word to one token. High: espeak merges or
    # splits rarely, so the fewest uneven steps are right, placed where the lengths fit best (at 0.5,
    # letters read one by one, "a w s" with long names for short words, drew two extra steps).
    align_uneven_step_cost: float = 2.0
    # Letters of a word espeak may join to the one before it ("for a" → fɚɹə), and the bonus (log length
    # ratio) for that join: where the lengths cannot tell which neighbour took it, that one did.
    clitic_letters: int = 2
    clitic_bonus: float = 0.25
    # Cells (words × tokens) of the alignment table, at most; beyond it words are spread in proportion.
    # A sentence is at most ~60 words, so this bounds the work a pathological one can ask, not a real one.
    align_max_cells: int = 40_000

    def __post_init__(self) -> None:
        for f in fields(self):
            if not getattr(self, f.name) >= 0:  # NaN fails too
                raise ValueError(f"VoiceConfig.{f.name} must be ≥ 0, not {getattr(self, f.name)!r}")
        if min(self.piper_max_phonemes, self.kokoro_max_tokens, self.align_most_per_step) < 1:
            raise ValueError("VoiceConfig: a model run and an alignment step take at least one symbol")


VOICE_DEFAULT = VoiceConfig()
