"""Settings precedence: defaults < TOML < environment < flags; typos are errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.settings import Settings, load_settings


def test_precedence(tmp_path: Path) -> None:
    toml = tmp_path / "voxgate.toml"
    toml.write_text(
        '[voxgate]\nport = 9000\nmodel = "piper"\nidle_timeout = 60\n[voxgate.voice_aliases]\nalloy = "joe"\n'
    )
    s = load_settings(toml, env={"VOXGATE_PORT": "9100", "VOXGATE_SEND_TIMEOUT": "2.5"}, port=9200)
    assert s.port == 9200 and s.model == "piper" and s.host == "127.0.0.1"
    assert s.limits.idle_timeout == 60.0 and s.limits.send_timeout == 2.5
    assert s.voice_aliases == {"alloy": "joe"}
    assert load_settings(toml, env={"VOXGATE_PORT": "9100"}).port == 9100


def test_defaults_without_sources() -> None:
    s = load_settings(env={})
    assert (s.host, s.port, s.model, s.limits.config_timeout) == ("127.0.0.1", 8000, "cpu", 10.0)


@pytest.mark.parametrize(
    ("toml", "env", "match"),
    [
        ("[voxgate]\nprot = 1\n", {}, "unknown setting 'prot'"),
        ("", {"VOXGATE_PORT": "eighty"}, "port"),
        ("[voxgate]\nvoice_aliases = 3\n", {}, "must be a table"),
        ("[voxgate]\nevent_loop = \"trio\"\n", {}, "event_loop"),
    ],
)
def test_bad_settings_are_clear_errors(tmp_path: Path, toml: str, env: dict[str, str], match: str) -> None:
    path = tmp_path / "s.toml"
    path.write_text(toml)
    with pytest.raises(ValueError, match=match):
        load_settings(path, env=env)


def test_cli_reports_a_bad_config_file(tmp_path: Path) -> None:
    from gateway.cli import main

    bad = tmp_path / "bad.toml"
    bad.write_text("[voxgate]\nnope = 1\n")
    assert main(["serve", "--config", str(bad)]) == 2


def test_cli_refuses_an_open_non_loopback_bind(capsys: pytest.CaptureFixture[str]) -> None:
    from gateway.cli import main

    assert main(["serve", "--host", "0.0.0.0", "--port", "1"]) == 2
    assert "--insecure" in capsys.readouterr().err


def test_cli_exits_clearly_when_redis_is_unreachable(capsys: pytest.CaptureFixture[str]) -> None:
    from gateway.cli import main

    assert main(["serve", "--port", "1", "--redis-url", "redis://127.0.0.1:1/0"]) == 1
    assert "cannot reach Redis" in capsys.readouterr().err


def test_the_environments_strings_are_converted_and_checked() -> None:
    env = {"VOXGATE_INSECURE": "true", "VOXGATE_TRIM_LEADING_SILENCE": "0", "VOXGATE_HEADER_TIMEOUT": "2.5",
           "VOXGATE_MAX_OPEN_UTTERANCES": "3"}  # fmt: skip
    s = load_settings(env=env)
    assert s.insecure is True and s.limits.trim_leading_silence is False
    assert s.header_timeout == 2.5 and s.limits.max_open_utterances == 3
    with pytest.raises(ValueError, match="max_queue_wait_s"):  # the dataclass's own rule
        load_settings(env={"VOXGATE_MAX_QUEUE_WAIT_S": "0"})
    with pytest.raises(ValueError, match="setting insecure"):
        load_settings(env={"VOXGATE_INSECURE": "maybe"})


def test_the_event_loop_setting_reaches_uvicorn() -> None:
    from gateway.server import server_config

    for loop in ("auto", "asyncio"):
        assert server_config(None, Settings(event_loop=loop)).loop == loop
