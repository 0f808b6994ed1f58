// voxgate playground: streams typed text to /v1/audio/speech/stream as an LLM would, plays the
// PCM as it arrives through a jitter buffer, and shows commits, audio marks, TTFA and underruns.
// Plain script, no build step. `window.voxgate` exposes the live state for tests.
"use strict";

const $ = (id) => document.getElementById(id);
const HAN = "\u3400-\u4dbf\u4e00-\u9fff";
const PIECE = new RegExp(`[${HAN}]{1,2}|[^\\s${HAN}]+\\s*|\\s+`, "gu");
const ONSET_DBFS = -40, ONSET_WINDOW_MS = 10, ONSET_SUSTAIN_MS = 50; // as bench/audio_metrics.py

const SAMPLES = {
  en: "Sure, I can help with that. Your table for four is booked for Friday at 7:30 p.m. at the Harbour Grill. I've sent a confirmation to your email, and you can cancel up to two hours before.",
  zh: "好的，我来帮您安排。您周五晚上七点半在海港餐厅的四人桌已经订好了。确认信息已经发到您的邮箱，如需取消，请提前两个小时告诉我们。",
};

// The units an LLM streams: a word with its trailing space, or one or two Han characters.
function llmPieces(text) {
  return text.match(PIECE) || [];
}

const metrics = { frames: 0, bytes: 0, ttfaMs: null, audibleMs: null, underruns: 0, stallMs: 0, bufferedMs: 0 };
const S = {
  ws: null, config: null, sampleRate: 24000, ctx: null, connected: null,
  utt: null, playHead: 0, started: false, sources: [], timers: [], nextIndex: 0,
  log: [], errors: [],
};
window.voxgate = { metrics, state: S, llmPieces };

function log(line) {
  const t = (performance.now() / 1000).toFixed(3);
  S.log.push(`${t} ${line}`);
  if (S.log.length > 200) S.log.shift();
  $("log").textContent = S.log.slice(-60).join("\n");
  $("log").scrollTop = 1e9;
}

function setStatus(text, cls = "") {
  const el = $("status");
  el.textContent = text;
  el.className = `status ${cls}`;
}

function currentConfig() {
  const cfg = {
    type: "session.config", language: $("language").value, split_granularity: $("granularity").value,
    response_format: "pcm", stream_audio: true,
  };
  if ($("voice").value) cfg.voice = $("voice").value;
  return cfg;
}

// -- connection -----------------------------------------------------------------------------------

function wsUrl() {
  const proto = location.protocol === "https:" ? "wss:" : "ws:";
  const key = $("api-key").value.trim();
  // Browsers cannot set headers on a WebSocket: the gateway also takes the key as ?api_key=.
  const query = key ? `?api_key=${encodeURIComponent(key)}` : "";
  return `${proto}//${location.host}/v1/audio/speech/stream${query}`;
}

function waitReady() {
  return new Promise((resolve, reject) => { S.connected = { resolve, reject }; });
}

function settleReady(error) {
  const waiter = S.connected;
  S.connected = null;
  if (!waiter) return;
  if (error) waiter.reject(error); else waiter.resolve();
}

async function ensureSession() {
  const cfg = currentConfig();
  const same = S.config && JSON.stringify(S.config) === JSON.stringify(cfg);
  if (S.ws && S.ws.readyState === WebSocket.OPEN && same) return;
  if (!S.ws || S.ws.readyState !== WebSocket.OPEN) {
    S.ws = new WebSocket(wsUrl());
    S.ws.binaryType = "arraybuffer";
    S.nextIndex = 0; // the server numbers utterances per connection, from 0
    S.ws.onmessage = onMessage;
    S.ws.onclose = () => {
      setStatus("disconnected");
      S.ws = null;
      S.config = null;
      settleReady(new Error("the connection closed"));
    };
    await new Promise((resolve, reject) => {
      S.ws.onopen = resolve;
      S.ws.onerror = () => reject(new Error("WebSocket failed"));
    });
  }
  const ready = waitReady();
  S.ws.send(JSON.stringify(cfg)); // sticky; re-sent between utterances when a control changed
  await ready;
  S.config = cfg;
}

// -- streaming text -------------------------------------------------------------------------------

async function speak() {
  const text = $("text").value;
  if (!text.trim()) return;
  // An AudioContext may only start inside a user gesture; buffers carry the stream's own rate.
  if (!S.ctx) S.ctx = new (window.AudioContext || window.webkitAudioContext)();
  if (S.ctx.state === "suspended") await S.ctx.resume();
  const prev = S.utt;
  if (prev && !prev.done && !prev.cancelled && S.ws && S.ws.readyState === WebSocket.OPEN) {
    // Speaking again interrupts: the open (or still playing) utterance is cancelled first.
    prev.cancelled = true;
    S.ws.send(JSON.stringify({ type: "input.cancel" }));
  }
  stopAudio();
  try {
    await ensureSession();
  } catch (e) {
    setStatus(String(e.message || e), "err");
    return;
  }
  resetUtterance(text);
  const pieces = llmPieces(text);
  const rate = Number($("rate").value);
  $("rate-out").textContent = String(rate);
  const t0 = performance.now();
  S.utt.tFirstText = t0;
  $("cancel").disabled = false;
  const utt = S.utt;
  const send = (i) => {
    if (!S.ws || utt.cancelled) return;
    S.ws.send(JSON.stringify({ type: "input.text", text: pieces[i] }));
    utt.sent += pieces[i].length;
    render();
    if (i === pieces.length - 1) {
      S.ws.send(JSON.stringify({ type: "input.done" }));
      utt.tLastText = performance.now();
      log("→ input.done");
    }
  };
  // The first piece goes now, so the server has opened this utterance (and numbered it) before
  // anything else can happen; the rest on absolute deadlines, like bench/load.py.
  send(0);
  for (let i = 1; i < pieces.length; i++) {
    S.timers.push(setTimeout(() => send(i), Math.max(0, t0 + (i * 1000) / rate - performance.now())));
  }
  log(`→ ${pieces.length} pieces at ${rate}/s`);
}

function resetUtterance(text) {
  S.utt = {
    text, sent: 0, segments: [], marks: [], chunks: [], samples: 0, index: S.nextIndex++, cancelled: false,
    audioStarted: false,
    done: false, tFirstText: null, tLastText: null, onset: newOnset(), speaking: null,
  };
  S.started = false;
  Object.assign(metrics, { frames: 0, bytes: 0, ttfaMs: null, audibleMs: null, underruns: 0, stallMs: 0 });
  $("segments").innerHTML = "";
  $("cancelled").hidden = true;
  render();
  readouts();
}

// Milliseconds of the current utterance the listener has heard: what was scheduled and is now past.
// Sent with the cancel, so the server answers with `heard_text` (docs/protocol.md, played_ms).
function playedMs() {
  const u = S.utt;
  if (!u || !S.ctx) return 0;
  const now = S.ctx.currentTime;
  let samples = 0;
  for (const c of u.chunks) samples += Math.min(c.n, Math.max(0, (now - c.at) * S.sampleRate));
  return Math.round((samples / S.sampleRate) * 1000);
}

// Barge-in stays possible while anything of the utterance is still to be heard: the server finishes
// an utterance (session.done) seconds before its audio has played, and a listener interrupts what
// they hear, not what was sent. After session.done the server answers `cancelled: false` (nothing
// left to stop there), and the audio still buffered here is dropped.
function bargeIn() {
  if (!S.ws || !S.utt) return;
  const played = playedMs();
  S.utt.cancelled = true; // frames still in flight before audio.cancelled are dropped
  S.ws.send(JSON.stringify({ type: "input.cancel", played_ms: played }));
  log(`→ input.cancel (played_ms ${played})`);
  stopAudio();
  $("cancel").disabled = true;
}

function playbackEnded() {
  const u = S.utt;
  if (!u || u.cancelled) return;
  $("cancel").disabled = true;
  finishSpeaking();
}

function stopAudio() {
  S.timers.forEach(clearTimeout);
  S.timers = [];
  for (const src of S.sources) { try { src.stop(); } catch (_) { /* already ended */ } }
  S.sources = [];
  if (S.ctx) S.playHead = S.ctx.currentTime;
  S.started = false;
}

// -- server messages ------------------------------------------------------------------------------

function onMessage(ev) {
  if (typeof ev.data !== "string") return onAudio(ev.data);
  const msg = JSON.parse(ev.data);
  const u = S.utt;
  if (u && msg.utterance_index !== undefined && msg.utterance_index !== u.index) {
    log(`← ${msg.type} (utterance ${msg.utterance_index}, not the current one: ignored)`);
    return;
  }
  switch (msg.type) {
    case "session.ready":
      S.sampleRate = msg.sample_rate || 24000;
      setStatus(`connected · ${msg.voice || "default voice"} · ${msg.language} · ${S.sampleRate} Hz`, "ok");
      settleReady(null);
      break;
    case "segment.committed":
      if (!u || u.cancelled) break;
      u.segments[msg.segment_index] = { ...msg, state: "committed" };
      addSegmentRow(msg);
      break;
    case "audio.start":
      if (u) u.audioStarted = true; // binary frames before it belong to an earlier utterance
      if (msg.sample_rate) S.sampleRate = msg.sample_rate;
      break;
    case "audio.mark":
      if (!u || u.cancelled) break;
      u.marks.push({ segment: msg.segment_index, offset: msg.sample_offset, placed: false });
      placeMarks();
      break;
    case "session.done":
      if (u && !u.cancelled) {
        u.done = true; // all of it was sent; Barge-in stays on until it has played
        const end = S.ctx ? Math.max(0, (S.playHead - S.ctx.currentTime) * 1000) : 0;
        S.timers.push(setTimeout(playbackEnded, end));
      }
      break;
    case "audio.cancelled":
      showCancelled(msg);
      break;
    case "error":
      S.errors.push(msg);
      setStatus(`error ${msg.code}: ${msg.message}`, "err");
      settleReady(new Error(`${msg.code}: ${msg.message}`)); // a refused session.config
      break;
    default:
      break;
  }
  log(`← ${msg.type} ${brief(msg)}`);
}

function brief(msg) {
  const { type, ...rest } = msg;
  const s = JSON.stringify(rest);
  return s.length > 120 ? `${s.slice(0, 117)}…` : s;
}

function onAudio(buf) {
  const u = S.utt;
  if (!u || u.cancelled || !u.audioStarted || !S.ctx) return;
  const now = performance.now();
  const pcm = new Int16Array(buf);
  metrics.frames += 1;
  metrics.bytes += buf.byteLength;
  if (metrics.ttfaMs === null) metrics.ttfaMs = now - u.tFirstText;
  if (metrics.audibleMs === null && feedOnset(u.onset, pcm)) metrics.audibleMs = now - u.tFirstText;
  schedule(pcm);
  readouts();
}

// -- playback: a jitter buffer over Web Audio -----------------------------------------------------

function schedule(pcm) {
  const u = S.utt;
  const rate = S.sampleRate;
  const jitter = Math.max(0, Number($("jitter").value) || 0) / 1000;
  const now = S.ctx.currentTime;
  if (!S.started) {
    S.started = true;
    S.playHead = now + jitter;
  } else if (S.playHead < now) {
    // The buffer ran dry: the listener heard a gap. Re-buffer by the jitter allowance.
    metrics.underruns += 1;
    metrics.stallMs += (now - S.playHead) * 1000;
    S.playHead = now + jitter;
  }
  const data = new Float32Array(pcm.length);
  for (let i = 0; i < pcm.length; i++) data[i] = pcm[i] / 32768;
  const ab = S.ctx.createBuffer(1, pcm.length, rate);
  ab.copyToChannel(data, 0);
  const src = S.ctx.createBufferSource();
  src.buffer = ab;
  src.connect(S.ctx.destination);
  src.start(S.playHead);
  src.onended = () => { S.sources = S.sources.filter((s) => s !== src); };
  S.sources.push(src);
  u.chunks.push({ at: S.playHead, first: u.samples, n: pcm.length });
  u.samples += pcm.length;
  S.playHead += pcm.length / rate;
  placeMarks();
}

// A mark says where a segment's audio begins; light the segment when that sample plays.
function placeMarks() {
  const u = S.utt;
  for (const m of u.marks) {
    if (m.placed) continue;
    const c = u.chunks.find((c) => m.offset >= c.first && m.offset < c.first + c.n);
    if (!c) continue;
    m.placed = true;
    const at = c.at + (m.offset - c.first) / S.sampleRate;
    const delay = Math.max(0, (at - S.ctx.currentTime) * 1000);
    S.timers.push(setTimeout(() => speaking(m.segment), delay));
  }
}

function speaking(index) {
  const u = S.utt;
  if (!u || u.cancelled) return;
  if (u.speaking !== null && u.segments[u.speaking]) u.segments[u.speaking].state = "spoken";
  if (u.segments[index]) u.segments[index].state = "speaking";
  u.speaking = index;
  render();
  updateRows();
}

function finishSpeaking() {
  const u = S.utt;
  if (!u || u.cancelled) return;
  for (const s of u.segments) if (s && s.state === "speaking") s.state = "spoken";
  render();
  updateRows();
}

// -- audible onset (same rule as the load harness) ------------------------------------------------

function newOnset() {
  return { window: 0, need: Math.ceil(ONSET_SUSTAIN_MS / ONSET_WINDOW_MS), run: 0, acc: 0, n: 0, found: false };
}

function feedOnset(o, pcm) {
  if (o.found) return true;
  o.window = o.window || Math.max(1, Math.round((S.sampleRate * ONSET_WINDOW_MS) / 1000));
  const threshold = Math.pow(10, ONSET_DBFS / 20);
  for (let i = 0; i < pcm.length; i++) {
    const x = pcm[i] / 32768;
    o.acc += x * x;
    o.n += 1;
    if (o.n === o.window) {
      const rms = Math.sqrt(o.acc / o.n);
      o.run = rms > threshold ? o.run + 1 : 0;
      o.acc = 0;
      o.n = 0;
      if (o.run >= o.need) { o.found = true; return true; }
    }
  }
  return false;
}

// -- rendering ------------------------------------------------------------------------------------

function render() {
  const u = S.utt;
  const view = $("view");
  view.textContent = "";
  if (!u) return;
  let pos = 0;
  for (const s of u.segments) {
    if (!s) continue;
    if (s.start > pos) view.append(span(u.text.slice(pos, s.start), "sent"));
    view.append(span(u.text.slice(s.start, s.end), s.state));
    pos = Math.max(pos, s.end);
  }
  if (u.sent > pos) view.append(span(u.text.slice(pos, u.sent), "sent"));
  view.append(span(u.text.slice(Math.max(pos, u.sent)), "pending"));
}

function span(text, cls) {
  const el = document.createElement("span");
  el.className = cls;
  el.textContent = text;
  return el;
}

function addSegmentRow(msg) {
  const tr = document.createElement("tr");
  tr.dataset.index = msg.segment_index;
  for (const v of [msg.segment_index, msg.reason, msg.text, "committed"]) {
    const td = document.createElement("td");
    td.textContent = v;
    tr.append(td);
  }
  tr.lastChild.className = "state";
  $("segments").append(tr);
  render();
}

function updateRows() {
  for (const tr of $("segments").children) {
    const s = S.utt.segments[Number(tr.dataset.index)];
    if (!s) continue;
    tr.lastChild.textContent = s.state;
    tr.className = s.state;
  }
}

function showCancelled(msg) {
  const el = $("cancelled");
  const heard = (S.utt ? S.utt.segments : []).filter((s) => s && s.state !== "committed").map((s) => s.text).join("");
  const secs = (msg.played_bytes / 2 / S.sampleRate).toFixed(2);
  el.hidden = false;
  el.textContent = `Barge-in: the server had sent ${secs} s of audio. Spoken (server): “${msg.spoken_text}”` +
    (msg.heard_text !== undefined ? ` · heard (server, from played_ms): “${msg.heard_text}”` : "") +
    (heard ? ` · heard here: “${heard}”` : "");
  if (S.utt) {
    for (const s of S.utt.segments) if (s && s.state === "speaking") s.state = "spoken";
    render();
    updateRows();
  }
}

function readouts() {
  const ms = (v) => (v === null ? "–" : `${Math.round(v)} ms`);
  $("ttfa").textContent = ms(metrics.ttfaMs);
  $("ttfa-audible").textContent = ms(metrics.audibleMs);
  $("underruns").textContent = String(metrics.underruns);
  $("stall").textContent = `${Math.round(metrics.stallMs)} ms`;
  $("frames").textContent = String(metrics.frames);
  $("audio-s").textContent = `${(metrics.bytes / 2 / S.sampleRate).toFixed(2)} s`;
}

setInterval(() => {
  if (!S.ctx) return;
  metrics.bufferedMs = Math.max(0, (S.playHead - S.ctx.currentTime) * 1000);
  $("buffered").textContent = `${Math.round(metrics.bufferedMs)} ms`;
}, 100);

async function loadVoices() {
  try {
    const key = $("api-key").value.trim();
    const r = await fetch("/v1/audio/voices", key ? { headers: { Authorization: `Bearer ${key}` } } : {});
    if (!r.ok) return;
    const body = await r.json();
    const select = $("voice");
    while (select.options.length > 1) select.remove(1);
    for (const v of body.voices || []) {
      const opt = document.createElement("option");
      opt.value = v.name;
      opt.textContent = `${v.name} (${v.kind === "clone" ? "cloned" : (v.languages || []).join(", ")})`;
      $("voice").append(opt);
    }
    $("clone-box").hidden = !body.cloning; // engines that clone (Qwen3 Base checkpoints)
  } catch (_) { /* the voice list is optional: the default voice always works */ }
}

// A cloned voice: the recording goes to the registry as a base64 data: URI with its transcript, then
// it is selected like any voice (the server makes it into a voice on first use).
async function cloneVoice() {
  const file = $("clone-file").files[0];
  const name = $("clone-name").value.trim();
  if (!file || !name) { log("clone: pick a recording and name the voice"); return; }
  const dataUri = await new Promise((resolve, reject) => {
    const reader = new FileReader();
    reader.onload = () => resolve(reader.result);
    reader.onerror = () => reject(reader.error);
    reader.readAsDataURL(file);
  });
  const key = $("api-key").value.trim();
  const r = await fetch("/v1/audio/voices", {
    method: "POST",
    headers: { "Content-Type": "application/json", ...(key ? { Authorization: `Bearer ${key}` } : {}) },
    // Without a transcript the voice is x-vector only: it starts sooner but sounds less like the recording.
    body: JSON.stringify({ voice_id: name, ref_audio: dataUri, ref_text: $("clone-text").value.trim() || null }),
  });
  const body = await r.json();
  if (!r.ok) { log(`clone refused: ${body.error ? body.error.code + ": " + body.error.message : r.status}`); return; }
  log(`voice ${name} cloned`);
  await loadVoices();
  $("voice").value = name; // the next Speak re-sends session.config with it
}

$("rate").addEventListener("input", () => { $("rate-out").textContent = $("rate").value; });
$("api-key").addEventListener("change", () => {
  if (S.ws) S.ws.close(); // the next Speak connects with the new key
  loadVoices();
});
$("speak").addEventListener("click", speak);
$("clone").addEventListener("click", cloneVoice);
$("cancel").addEventListener("click", bargeIn);
$("sample-en").addEventListener("click", () => { $("text").value = SAMPLES.en; $("language").value = "en"; });
$("sample-zh").addEventListener("click", () => { $("text").value = SAMPLES.zh; $("language").value = "zh"; });

// The page connects on the first Speak; until then it says whether the server is up, not "disconnected".
async function showServer() {
  try {
    const r = await fetch("/health");
    const body = await r.json();
    if (S.ws) return; // a session opened meanwhile says more
    if (r.ok) setStatus(`server ready (${body.model || "model"}) · Speak opens a session`, "ok");
    else setStatus(`server ${body.status || r.status}: ${body.detail || "not ready yet"}`, "err");
  } catch (_) { setStatus("server unreachable", "err"); }
}
showServer();
loadVoices();
