"""End to end in headless Chromium: the page streams text to a real gateway, plays the audio as it
arrives, shows commits, marks and TTFA, and barges in. Screenshots land in the test's tmp_path."""

from __future__ import annotations

import re
import shutil
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import soundfile
from support.servers import serve

from engine import load_engine

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")
webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed")

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        CHROMIUM is None or CHROMEDRIVER is None, reason="Debian chromium and chromium-driver are not installed"
    ),
]


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[object]:
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--disable-dev-shm-usage", "--autoplay-policy=no-user-gesture-required",
                 "--window-size=1100,1400", f"--user-data-dir={tmp_path / 'profile'}"):  # fmt: skip
        opts.add_argument(flag)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=opts)
    driver.set_script_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()


def wait_for(driver: object, script: str, timeout: float = 30.0) -> object:
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, timeout, poll_frequency=0.1).until(lambda d: d.execute_script(script))


def set_text(driver: object, text: str, rate: int) -> None:
    driver.execute_script(
        "document.getElementById('text').value = arguments[0];"
        "document.getElementById('rate').value = arguments[1];"
        "document.getElementById('language').value = 'en';", text, rate,
    )  # fmt: skip


def test_page_streams_a_sentence_and_shows_it(playground_server: str, browser: object, tmp_path: Path) -> None:
    d = browser
    d.get(playground_server + "/")
    assert "voxgate" in d.title
    set_text(d, "Your table is booked for Friday at seven. I sent the confirmation to your email.", 40)
    d.find_element("id", "speak").click()
    wait_for(d, "const u = window.voxgate.state.utt; return !!(u && u.done);")
    # The CPU voices cannot clone: the clone box is hidden, not merely marked so (.controls is flex).
    assert not d.find_element("id", "clone-box").is_displayed()
    m = d.execute_script("return window.voxgate.metrics;")
    assert m["frames"] > 0 and m["bytes"] > 24000  # well over half a second of speech
    assert m["ttfaMs"] is not None and 0 < m["ttfaMs"] < 10000
    assert m["audibleMs"] is not None and m["audibleMs"] >= m["ttfaMs"]
    rows = d.find_elements("css selector", "#segments tr")
    assert len(rows) >= 2  # two sentences committed
    assert "booked" in rows[0].text
    assert re.fullmatch(r"\d+ ms", d.find_element("id", "ttfa").text)
    assert re.fullmatch(r"\d+ ms", d.find_element("id", "ttfa-audible").text)
    assert d.find_element("id", "underruns").text.isdigit()
    # Marks light up the text as it plays: every segment ends up spoken once playback ends.
    wait_for(d, "return [...document.querySelectorAll('#segments tr td.state')]"
                ".every(td => td.textContent === 'spoken');", timeout=20)  # fmt: skip
    assert d.find_elements("css selector", "#view .spoken")
    assert not d.execute_script("return window.voxgate.state.errors;")
    # A second utterance on the same connection (utterance_index 1) plays too.
    set_text(d, "And one more thing.", 40)
    d.find_element("id", "speak").click()
    wait_for(d, "const u = window.voxgate.state.utt; return !!(u && u.done && u.index === 1);")
    second = d.execute_script("return window.voxgate.metrics;")
    assert second["frames"] > 0 and 0 < second["bytes"] < m["bytes"]  # counted afresh, a shorter text
    assert d.execute_script("return window.voxgate.state.utt.text;") == "And one more thing."
    set_text(d, "Your table is booked for Friday at seven. I sent the confirmation to your email.", 40)
    d.find_element("id", "speak").click()
    wait_for(d, "const u = window.voxgate.state.utt; return !!(u && u.done && u.index === 2);")
    wait_for(d, "return [...document.querySelectorAll('#segments tr td.state')]"
                ".every(td => td.textContent === 'spoken');", timeout=20)  # fmt: skip
    shot = tmp_path / "playground.png"
    d.save_screenshot(str(shot))
    assert shot.stat().st_size > 10_000
    print(f"screenshot: {shot}")


def test_barge_in_stops_and_says_what_was_spoken(playground_server: str, browser: object, tmp_path: Path) -> None:
    d = browser
    d.get(playground_server + "/")
    long_text = " ".join(["The first sentence is short.", "Then comes a much longer part, with a clause."] * 6)
    set_text(d, long_text, 8)  # slow text: the barge-in lands mid-utterance
    d.find_element("id", "speak").click()
    wait_for(d, "return window.voxgate.metrics.frames > 0;")
    d.find_element("id", "cancel").click()
    wait_for(d, "return !document.getElementById('cancelled').hidden;", timeout=15)
    note = d.find_element("id", "cancelled").text
    assert "Spoken (server)" in note and "first sentence" in note
    frames = d.execute_script("return window.voxgate.metrics.frames;")
    sent = d.execute_script("return window.voxgate.state.utt.sent;")
    assert sent < len(long_text)  # the text stream stopped with the barge-in
    d.save_screenshot(str(tmp_path / "barge-in.png"))
    import time

    time.sleep(1.0)
    assert d.execute_script("return window.voxgate.metrics.frames;") == frames  # no audio after it
    # The connection goes on: the next utterance (index 1) plays in full.
    set_text(d, "Okay, stopping there.", 40)
    d.find_element("id", "speak").click()
    wait_for(d, "const u = window.voxgate.state.utt; return !!(u && u.done && u.index === 1);")
    assert d.execute_script("return window.voxgate.metrics.frames;") > 0
    # Speaking again mid-utterance interrupts it (input.cancel first), and the new one plays.
    set_text(d, long_text, 8)
    d.find_element("id", "speak").click()
    wait_for(d, "return window.voxgate.metrics.frames > 0;")
    set_text(d, "New answer.", 40)
    d.find_element("id", "speak").click()
    wait_for(d, "const u = window.voxgate.state.utt; return !!(u && u.done && u.index === 3);")
    assert d.execute_script("return window.voxgate.metrics.frames;") > 0
    assert not d.execute_script("return window.voxgate.state.errors;")


def test_before_the_first_speak_the_page_says_the_server_is_up(playground_server: str, browser: object) -> None:
    """The page connects lazily; until then it shows the server's health, never "disconnected"."""
    d = browser
    d.get(playground_server + "/")
    wait_for(d, "return document.getElementById('status').textContent.includes('Speak opens a session');", 15)
    status = d.find_element("id", "status")
    assert "disconnected" not in status.text and "ok" in status.get_attribute("class"), status.text
    assert d.find_element("id", "cancel").get_attribute("disabled") is not None  # nothing to interrupt yet


def test_barge_in_stays_usable_while_the_reply_still_plays(playground_server: str, browser: object) -> None:
    """session.done comes when the last audio was sent, seconds before it has played: Barge-in stays on
    until playback ends, and pressing it then silences the rest and says what was heard."""
    d = browser
    d.get(playground_server + "/")
    reply = "Your table is booked for Friday at seven. I sent the confirmation to your email, and you can cancel."
    set_text(d, reply, 80)
    d.find_element("id", "speak").click()
    wait_for(d, "const u = window.voxgate.state.utt; return !!(u && u.done);")
    buffered = d.execute_script("const S = window.voxgate.state; return (S.playHead - S.ctx.currentTime) * 1000;")
    assert buffered > 1000, f"only {buffered:.0f} ms left to play at session.done: nothing to test"
    cancel = d.find_element("id", "cancel")
    assert cancel.get_attribute("disabled") is None, "Barge-in was disabled at session.done, with audio still playing"
    cancel.click()
    wait_for(d, "return !document.getElementById('cancelled').hidden;", timeout=15)
    assert d.execute_script("return window.voxgate.state.sources.length;") == 0  # the rest is silenced
    note = d.find_element("id", "cancelled").text
    assert "heard (server, from played_ms)" in note, note
    assert cancel.get_attribute("disabled") is not None
    assert not d.execute_script("return window.voxgate.state.errors;")
    # Left to play out, the reply ends with Barge-in off again.
    set_text(d, "Okay.", 80)
    d.find_element("id", "speak").click()
    wait_for(d, "const u = window.voxgate.state.utt; return !!(u && u.done && u.index === 1);")
    wait_for(d, "return document.getElementById('cancel').disabled;", timeout=15)
    assert d.execute_script("return window.voxgate.state.ctx.currentTime >= window.voxgate.state.playHead - 0.05;")


@pytest.fixture(scope="module")
def base_playground(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A gateway on a tiny Qwen3 Base checkpoint: it speaks cloned voices only."""
    engine = load_engine("tiny-base", cache_dir=tmp_path_factory.mktemp("cache"), frames_per_token=2.0, min_frames=6)
    try:
        for addr in serve(engine):
            yield f"http://{addr}"
    finally:
        engine.close()


def test_a_voice_cloned_in_the_page_speaks(base_playground: str, browser: object, tmp_path: Path) -> None:
    t = np.arange(36000) / 24000
    ref = tmp_path / "me.wav"
    soundfile.write(ref, (0.3 * np.sin(2 * np.pi * 170 * t)).astype(np.float32), 24000)
    d = browser
    d.get(base_playground + "/")
    wait_for(d, "return !document.getElementById('clone-box').hidden;")  # the engine can clone
    d.find_element("id", "clone-file").send_keys(str(ref))
    d.find_element("id", "clone-text").send_keys("Good morning.")
    d.find_element("id", "clone").click()
    wait_for(d, "return document.getElementById('voice').value === 'my-voice';")
    set_text(d, "Hello from a cloned voice. It works in the page too.", 40)
    d.find_element("id", "speak").click()
    wait_for(d, "const u = window.voxgate.state.utt; return !!(u && u.done);")
    assert d.execute_script("return window.voxgate.metrics.bytes;") > 2 * 1920
    assert not d.execute_script("return window.voxgate.state.errors;")
    assert "voice my-voice cloned" in d.find_element("id", "log").text
