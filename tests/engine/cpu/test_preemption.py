"""A Kokoro run gives its worker up to a more urgent job (engine/cpu/pool.py, `CpuStream.yield_worker`):
its model run is really aborted (onnxruntime's terminate), and the piece runs again, whole, so its
listener hears all of it."""

from __future__ import annotations

from typing import Any

from support.waits import until

SENTENCE = "我们的系统会自动根据您的使用习惯推荐最合适的套餐方案。"


async def test_a_piece_that_gives_its_worker_up_runs_again_whole(cpu_engine: Any, collect: Any,
                                                                pcm: Any, monkeypatch: Any) -> None:
    runs: list[str] = []  # how each model run of the piece ended
    real = cpu_engine.synthesise

    def synthesise(*args: Any) -> Any:
        try:
            yield from real(*args)
            runs.append("whole")
        except Exception as exc:
            runs.append(type(exc).__name__)
            raise

    monkeypatch.setattr(cpu_engine, "synthesise", synthesise)
    hooks: list[Any] = []  # each job's `yield_to`, as the stream hands it to the pool
    submit = cpu_engine.pool.submit

    def recording(*args: Any, **kwargs: Any) -> Any:
        hooks.append(kwargs["yield_to"])
        return submit(*args, **kwargs)

    monkeypatch.setattr(cpu_engine.pool, "submit", recording)
    stream = cpu_engine.open_stream("jf_gongitsune", "zh")
    stream.append(SENTENCE)
    stream.finish()
    await until(lambda: (pieces := stream.snapshot.pieces) and pieces[0].started_at is not None,
                "its piece starts", 20)
    yield_to = hooks[0]
    job = yield_to.args[0]  # the hook is `CpuStream.yield_worker` of its job
    assert yield_to()  # a Kokoro run puts its audio out only at its end: it can
    assert not yield_to()  # once
    chunks, end = await collect(stream)
    assert end.reason == "done" and runs[0] != "whole" and runs[1:] == ["whole"]
    assert pcm(chunks).size / chunks[0].sample_rate > 2.0  # the whole sentence, not a cut one
    assert job.made >= 1  # its runs put their audio out once, in the run that went whole


def test_a_piece_that_has_put_audio_out_keeps_its_worker(cpu_engine: Any) -> None:
    # A Piper piece of several sentences puts out each run's audio as it comes: run again, it would be
    # heard twice. Once any is out, it keeps its worker.
    from engine.cpu.jobs import PieceJob

    stream = cpu_engine.open_stream("joe", "en")
    try:
        job = PieceJob(next(cpu_engine.cut_pieces(None, "en", 0, "Hello there. How are you?")), cpu_engine.clock())
        job.made = 1
        assert not stream.yield_worker(job) and not job.preempted
    finally:
        stream.cancel()
