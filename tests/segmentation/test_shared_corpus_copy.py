"""The in-repo copy of the shared corpus stays identical to ../shared/corpus when that is present."""

from __future__ import annotations

from support.segcases import REPO, SHARED_CORPUS

ORIGINAL = REPO.parent / "shared" / "corpus" / "segmentation_cases.jsonl"


def test_corpus_copy_matches_the_shared_original() -> None:
    if ORIGINAL.exists():  # CI checkouts may not have shared/ beside them; the copy is then the source
        assert SHARED_CORPUS.read_bytes() == ORIGINAL.read_bytes(), "refresh tests/data from ../shared/corpus"
    assert SHARED_CORPUS.stat().st_size > 1000
