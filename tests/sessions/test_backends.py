"""Redis URLs: the multi-host forms parse as documented, a bad one is a clear ValueError, and no URL
shown to an operator carries its password."""

from __future__ import annotations

import pytest

from sessions import SessionStore
from sessions.backends import parse_url, redact


def test_sentinel_and_cluster_urls_parse() -> None:
    u = parse_url("redis+sentinel://:s%40cret@10.0.0.1:26379,10.0.0.2:26380/voxgate/2?sentinel_password=x")
    assert (u.kind, u.tls, u.hosts, u.master, u.db) == ("sentinel", False, (("10.0.0.1", 26379), ("10.0.0.2", 26380)),
                                                        "voxgate", 2)  # fmt: skip
    assert (u.password, u.sentinel_password) == ("s@cret", "x")
    c = parse_url("rediss+cluster://user:pw@a:7000,b:7001")
    assert (c.kind, c.tls, c.hosts) == ("cluster", True, (("a", 7000), ("b", 7001)))
    assert (c.username, c.password) == ("user", "pw")
    assert parse_url("redis://h:1/0").kind == parse_url("unix:///tmp/r.sock").kind == "redis"


@pytest.mark.parametrize("url", [
    "http://h:1", "redis+sentinel://h:26379", "redis+sentinel:///m", "redis+cluster://h", "redis+cluster://h:1/3",
])  # fmt: skip
def test_an_unusable_url_is_a_value_error(url: str) -> None:
    with pytest.raises(ValueError):
        SessionStore.from_url(url)


def test_redact_hides_passwords_and_queries() -> None:
    assert redact("redis://u:secret@h:1/0") == "redis://u:***@h:1/0"
    assert redact("redis+sentinel://:pw@a:1,b:2/m?sentinel_password=x") == "redis+sentinel://:***@a:1,b:2/m?…"
    assert redact("redis://h:1") == "redis://h:1"
    assert "p@ss" not in redact("redis://u:p@ss@h:1")
