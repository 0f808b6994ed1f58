from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from engine.qwen3 import GenerationRequest, Qwen3TTSModel, SamplingParams, generate, load_model

FRAMES = 20
LONG = "The quick brown fox jumps over the lazy dog, and then it runs all the way back home again."


def _requests(model: Qwen3TTSModel, greedy: bool, seeds: tuple[int, ...] = (11, 12, 13)) -> list[GenerationRequest]:
    """Three prompts of different lengths, voices, languages and text modes; they end at different frames
    (two by EOS after their text, one at max_frames)."""
    prompts = [
        model.build_prompt(LONG, voice="ryan", language="english"),
        model.build_prompt("Hello there, how are you?", voice="vivian", language="auto", streaming_text=False),
        model.build_prompt("你好，今天天气很好。", voice="dylan", language="chinese"),
    ]
    return [GenerationRequest(p, SamplingParams.from_defaults(model.gen, greedy=greedy, seed=s), 48)
            for p, s in zip(prompts, seeds, strict=True)]


@pytest.mark.parametrize("greedy", [True, False], ids=["greedy", "seeded-sampling"])
def test_batched_generation_equals_each_request_alone(tiny_model: Qwen3TTSModel, greedy: bool) -> None:
    batched = generate.generate_batch(tiny_model, _requests(tiny_model, greedy))
    assert len({b.shape[0] for b in batched}) == 3  # rows really leave the batch at different steps
    assert max(b.shape[0] for b in batched) >= FRAMES
    for i, req in enumerate(_requests(tiny_model, greedy)):
        alone = generate.generate_batch(tiny_model, [req])[0]
        assert np.array_equal(alone, batched[i]), f"request {i} differs when batched"


def test_tiny_model_ends_right_after_its_text_in_streaming_mode(tiny_model: Qwen3TTSModel) -> None:
    """The tiny checkpoint is wired to say EOS after reading tts_eos (tiny.py), so streams end on their own."""
    for text in (LONG, "你好，今天天气很好。"):
        n_tokens = len(tiny_model.tokenizer.content_ids(text))
        codes = tiny_model.generate(text, voice="ryan", greedy=True, max_frames=200)
        assert codes.shape[0] == n_tokens
        assert tiny_model.generate(text, voice="ryan", seed=3, max_frames=200).shape[0] == n_tokens


def test_codes_are_real_codes_and_vary(tiny_model: Qwen3TTSModel) -> None:
    codes = tiny_model.generate("Hello there.", voice="ryan", language="english", greedy=True, max_frames=FRAMES,
                                streaming_text=False)
    assert codes.dtype == np.int64 and codes.shape == (FRAMES, 16)
    assert codes.min() >= 0 and codes.max() < 2048  # control ids are suppressed
    assert len(np.unique(codes[:, 0])) > 5


def test_seed_reproduces_and_different_seeds_differ(tiny_model: Qwen3TTSModel) -> None:
    kw = {"voice": "ryan", "language": "english", "max_frames": 10, "streaming_text": False}
    a = tiny_model.generate("Hello there.", seed=5, **kw)
    b = tiny_model.generate("Hello there.", seed=5, **kw)
    c = tiny_model.generate("Hello there.", seed=6, **kw)
    greedy = tiny_model.generate("Hello there.", greedy=True, **kw)
    assert np.array_equal(a, b)
    assert not np.array_equal(a, c)
    assert not np.array_equal(a, greedy)


def test_prompt_conditions_the_output(tiny_model: Qwen3TTSModel) -> None:
    kw = {"language": "english", "greedy": True, "max_frames": 8, "streaming_text": False}
    a = tiny_model.generate("Hello there.", voice="ryan", **kw)
    assert not np.array_equal(a, tiny_model.generate("Hello there.", voice="vivian", **kw))
    assert not np.array_equal(a, tiny_model.generate("Good morning.", voice="ryan", **kw))


def test_incremental_talker_steps_equal_one_full_forward(tiny_model: Qwen3TTSModel) -> None:
    """Prefill + per-row single steps through the slot cache == one causal pass over the whole sequence."""
    talker = tiny_model.talker
    g = torch.Generator().manual_seed(3)
    seq = torch.randn(2, 12, talker.cfg.hidden_size, generator=g)
    lengths = torch.tensor([7, 5])
    with torch.no_grad():
        cache = talker.new_cache(4, 32)
        slots = torch.tensor([3, 1])
        _, last = talker.prefill(seq[:, :7], lengths, slots, cache)
        stepped = [last]
        for k in range(4):  # row 0 continues at 7.., row 1 (prompt of 5) at 5..
            x = torch.stack([seq[0, 7 + k], seq[1, 5 + k]])
            _, h = talker.step(x, lengths + k, slots, cache)
            stepped.append(h)
        ref_cache = talker.new_cache(1, 32)
        for row, n in ((0, 7), (1, 5)):
            whole = talker(seq[row:row + 1, : n + 4], torch.arange(n + 4)[None], torch.tensor([0]), ref_cache)[0]
            for k in range(5):
                assert torch.allclose(stepped[k][row], whole[n - 1 + k], atol=1e-5)


def test_a_reused_slot_never_sees_its_previous_occupant(tiny_model: Qwen3TTSModel) -> None:
    talker = tiny_model.talker
    g = torch.Generator().manual_seed(4)
    long, short = torch.randn(1, 20, 64, generator=g), torch.randn(1, 6, 64, generator=g)
    with torch.no_grad():
        used = talker.new_cache(1, 32)
        talker.prefill(long, torch.tensor([20]), torch.tensor([0]), used)
        fresh = talker.new_cache(1, 32)
        a, _ = talker.prefill(short, torch.tensor([6]), torch.tensor([0]), used)
        b, _ = talker.prefill(short, torch.tensor([6]), torch.tensor([0]), fresh)
        x = torch.randn(1, 64, generator=g)
        sa, _ = talker.step(x, torch.tensor([6]), torch.tensor([0]), used)
        sb, _ = talker.step(x, torch.tensor([6]), torch.tensor([0]), fresh)
    assert torch.equal(a, b) and torch.equal(sa, sb)


def test_max_frames_bounds_the_output(tiny_model: Qwen3TTSModel) -> None:
    assert tiny_model.generate(LONG, voice="ryan", greedy=True, max_frames=3).shape == (3, 16)
    assert tiny_model.generate("Hi.", voice="ryan", greedy=True, max_frames=0).shape == (0, 16)


@pytest.fixture(scope="module")
def eager_eos_model(tiny_dir: Path) -> Qwen3TTSModel:
    """The tiny checkpoint with an EOS logit that dominates whenever it is positive."""
    model = load_model(tiny_dir)
    with torch.no_grad():
        model.talker.codec_head.weight[model.eos_id] *= 100
    return model


def test_eos_ends_generation_but_not_before_two_frames(eager_eos_model: Qwen3TTSModel) -> None:
    codes = eager_eos_model.generate(LONG, voice="ryan", greedy=True, max_frames=50)
    assert 2 <= codes.shape[0] < 10  # min_new_tokens=2 masks EOS for the first two codebook-0 choices
    assert (codes[:, 0] != eager_eos_model.eos_id).all()  # the EOS frame itself is not returned
    plain = eager_eos_model.generate(LONG, voice="ryan", greedy=True, max_frames=codes.shape[0] + 5)
    assert np.array_equal(plain, codes)  # it stopped on EOS, not on max_frames


def test_unknown_voice_and_language_are_rejected(tiny_model: Qwen3TTSModel) -> None:
    with pytest.raises(ValueError, match="speaker 'nobody'"):
        tiny_model.generate("Hi.", voice="nobody")
    with pytest.raises(ValueError, match="language 'klingon'"):
        tiny_model.generate("Hi.", voice="ryan", language="klingon")
    with pytest.raises(ValueError, match="empty"):
        tiny_model.generate("", voice="ryan")


def _generate_live(model: Qwen3TTSModel, segments: list[list[int]], max_frames: int) -> np.ndarray:
    """The engine-core loop over the primitives with live text: the request is prefilled with the first
    segment only; whenever its trailing queue runs dry the row is parked (not fed tts_pad) until the
    next segment's rows arrive; tts_eos is appended after the last one."""
    tok, params = model.tokenizer, [SamplingParams.from_defaults(model.gen, greedy=True)]
    prompt = model.prompts.build(segments[0], role_ids=tok.role_ids(), language="english", speaker="ryan",
                                 final=False)
    pending = [model.prompts.text_rows(s) for s in segments[1:]] + [model.prompts.eos_row()]
    queue = list(prompt.trailing)
    cache = model.new_kv_cache(1, prompt.rows.shape[0] + max_frames + 1)
    slot, seen = torch.tensor([0]), torch.zeros(1, model.talker.cfg.vocab_size, dtype=torch.bool)
    n_gen, frames = torch.zeros(1, dtype=torch.long), []
    with torch.no_grad():
        logits, hidden = model.talker.prefill(prompt.rows[None], torch.tensor([prompt.rows.shape[0]]), slot, cache)
        cb0 = generate.choose_cb0(model, logits, seen, n_gen, params)
        while int(cb0[0]) != model.eos_id and len(frames) < max_frames:
            seen[0, cb0[0]] = True
            n_gen += 1
            frame = generate.complete_frames(model, hidden, cb0, params)
            frames.append(frame[0])
            g = len(frames) - 1
            while g >= len(queue) and pending:  # parked: text ran dry; resume when the next segment comes
                queue.extend(pending.pop(0))
            text_row = queue[g] if g < len(queue) else prompt.pad
            x = generate.next_inputs(model, frame, text_row[None])
            logits, hidden = model.talker.step(x, torch.tensor([prompt.rows.shape[0]]) + n_gen - 1, slot, cache)
            cb0 = generate.choose_cb0(model, logits, seen, n_gen, params)
    return torch.stack(frames).numpy()


def test_live_text_with_parking_equals_the_whole_text_at_once(tiny_model: Qwen3TTSModel) -> None:
    ids = tiny_model.tokenizer.content_ids(LONG)
    segments = [ids[:3], ids[3:4], ids[4:20], ids[20:]]
    live = _generate_live(tiny_model, segments, max_frames=80)
    whole = tiny_model.generate(LONG, voice="ryan", language="english", greedy=True, max_frames=80)
    assert live.shape[0] == len(ids)  # ended by EOS after the last segment's tts_eos, not by max_frames
    assert np.array_equal(live, whole)
