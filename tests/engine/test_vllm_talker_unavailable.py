"""Without vLLM installed (the default install), asking for the vLLM talker fails at once with a stable
code and says what to install; the CPU voices ignore a gateway-wide talker choice. The vLLM talker
itself is tested in its own tier (tests/vllm_talker, docs/vllm.md)."""

from __future__ import annotations

import importlib.util

import pytest

from engine import EngineError, load_engine
from engine.talker_backend import TALKERS


def _have_vllm() -> bool:
    spec = importlib.util.find_spec("vllm")
    return spec is not None and spec.origin is not None  # a namespace package (a folder) is not vLLM


@pytest.mark.skipif(_have_vllm(), reason="vLLM is installed here")
def test_the_vllm_talker_without_vllm_is_model_unavailable_naming_the_install() -> None:
    assert "vllm" in TALKERS
    with pytest.raises(EngineError) as err:
        load_engine("tiny", talker="vllm", max_streams=1, warm_up=False)
    assert err.value.code == "model_unavailable" and "voxgate[vllm]" in str(err.value)
