// omniduplex voice chat: microphone → WebRTC (Opus 48 kHz) → server; reply audio and JSON events back.
// State a test can read lives on window.omni (events, levels, byte counters, measured times in ms).
"use strict";

const SILENT = 1e-4;          // reply level (peak |x| over ~40 ms) below which playback counts as stopped
const ICE_TIMEOUT_MS = 5000;  // give up waiting for ICE gathering after this long (answer with what we have)

const $ = (id) => document.getElementById(id);
const omni = (window.omni = {
  connected: false, sessionId: null, events: [], errors: [],
  micLevel: 0, replyLevel: 0, replyLevelMax: 0,
  inboundBytes: 0, inboundPackets: 0, outboundBytes: 0, jitterBufferMs: null,
  latencyMs: [], stopMs: [], heardStopMs: [],
});
let pc = null, dc = null, mic = null, ctx = null, meterTimer = null, statsTimer = null;
let micAnalyser = null, replyAnalyser = null, bargeAt = null;
const bubbles = new Map(); // turn_id → {el, text}
const captions = new OmniCaptions($("captions"), { maxTurns: 3 }); // words as heard (captions.js)
omni.captionsText = () => captions.text();

function setStatus(text, cls) { const s = $("status"); s.textContent = text; s.className = `status ${cls}`; }
function showError(msg) { const e = $("error"); e.textContent = msg; e.hidden = !msg; if (msg) omni.errors.push(msg); }
function fmtMs(x) { return x == null ? "–" : `${Math.round(x)} ms`; }

function peak(analyser, buf) {
  analyser.getFloatTimeDomainData(buf);
  let m = 0;
  for (let i = 0; i < buf.length; i++) { const a = Math.abs(buf[i]); if (a > m) m = a; }
  return m;
}

function startMeters() {
  const buf = new Float32Array(2048), rbuf = new Float32Array(512);
  meterTimer = setInterval(() => {
    if (micAnalyser) { omni.micLevel = peak(micAnalyser, buf); $("mic-level").style.width = `${Math.min(100, omni.micLevel * 300)}%`; }
    if (replyAnalyser) {
      omni.replyLevel = peak(replyAnalyser, rbuf);
      omni.replyLevelMax = Math.max(omni.replyLevelMax, omni.replyLevel);
      // the tiny model's babble is quiet: show it on a log scale (-80 dBFS … 0)
      const db = 20 * Math.log10(omni.replyLevel + 1e-9);
      $("reply-level").style.width = `${Math.max(0, Math.min(100, (db + 80) * 1.25))}%`;
      if (bargeAt !== null && omni.replyLevel < SILENT) {
        omni.heardStopMs.push(performance.now() - bargeAt);
        bargeAt = null;
        renderStop();
      }
    }
  }, 10);
  statsTimer = setInterval(async () => {
    if (!pc) return;
    const stats = await pc.getStats();
    stats.forEach((r) => {
      if (r.type === "inbound-rtp" && r.kind === "audio") {
        omni.inboundBytes = r.bytesReceived; omni.inboundPackets = r.packetsReceived;
        // mean time a received sample waited in the jitter buffer (ms): part of the heard stop time
        if (r.jitterBufferEmittedCount) omni.jitterBufferMs = (1000 * r.jitterBufferDelay) / r.jitterBufferEmittedCount;
      }
      if (r.type === "outbound-rtp" && r.kind === "audio") omni.outboundBytes = r.bytesSent;
    });
    $("rx").textContent = `${(omni.inboundBytes / 1024).toFixed(1)} KiB · jitter buffer ${fmtMs(omni.jitterBufferMs)}`;
  }, 500);
}

function renderStop() {
  const s = omni.stopMs.at(-1), h = omni.heardStopMs.at(-1);
  $("stop").textContent = `${fmtMs(s)} / ${fmtMs(h)}`;
}

function bubble(turnId, role) {
  const key = `${role}:${turnId}`;
  if (!bubbles.has(key)) {
    const el = document.createElement("div");
    el.className = `msg ${role}`;
    el.innerHTML = `<span class="meta"></span><span class="body"></span>`;
    $("transcript").appendChild(el);
    bubbles.set(key, { el, text: "" });
  }
  return bubbles.get(key);
}

function onEvent(ev) {
  omni.events.push(ev);
  captions.handle(ev);
  switch (ev.type) {
    case "session_started": $("turn-state").textContent = "listening"; break;
    case "user_speech_started": $("turn-state").textContent = "user speaking"; break;
    case "user_turn_committed": {
      const b = bubble(ev.turn_id, "user");
      b.el.querySelector(".meta").textContent = "you";
      const body = b.el.querySelector(".body");
      if (!body.textContent) body.textContent = ev.text;  // a placeholder, unless partials showed words
      bubble(ev.turn_id, "assistant").el.querySelector(".meta").textContent = "assistant · thinking…";
      $("turn-state").textContent = "thinking";
      break;
    }
    case "user_transcript_partial":  // what the ASR heard so far, while the user still speaks
      if (ev.text) bubble(ev.turn_id, "user").el.querySelector(".body").textContent = ev.text;
      break;
    case "user_transcript":  // the user's words replace the placeholder once the ASR has them
      if (ev.text) bubble(ev.turn_id, "user").el.querySelector(".body").textContent = ev.text;
      break;
    case "duplex_text": {  // the duplex model's text stream: one running assistant line
      const b = bubble("duplex", "assistant");
      b.text += ev.text;
      b.el.querySelector(".body").textContent = b.text;
      break;
    }
    case "reply_text": {
      const b = bubble(ev.turn_id, "assistant");
      b.text += ev.text;
      b.el.querySelector(".body").textContent = b.text;
      break;
    }
    case "reply_audio_started":
      omni.latencyMs.push(ev.latency_ms);
      $("latency").textContent = fmtMs(ev.latency_ms);
      bubble(ev.turn_id, "assistant").el.querySelector(".meta").textContent = "assistant · speaking";
      $("turn-state").textContent = "assistant speaking";
      break;
    case "barge_in":
      bargeAt = performance.now();
      $("turn-state").textContent = "interrupted";
      break;
    case "reply_ended": {
      const b = bubble(ev.turn_id, "assistant");
      const meta = b.el.querySelector(".meta"), body = b.el.querySelector(".body");
      if (ev.reason === "interrupted") {
        omni.stopMs.push(ev.stop_ms);
        renderStop();
        b.el.classList.add("interrupted");
        meta.textContent = `assistant · interrupted after ${(ev.played_ms / 1000).toFixed(1)} s`;
        body.textContent = ev.kept_text;
        const rest = document.createElement("span");
        rest.className = "unplayed";
        rest.textContent = ev.text.slice(ev.kept_text.length);
        body.appendChild(rest);
        $("turn-state").textContent = "user speaking";
        break;
      } else {
        meta.textContent = `assistant · ${ev.reason} · ${(ev.played_ms / 1000).toFixed(1)} s`;
        if (ev.error) meta.textContent += ` · ${ev.error}`;
      }
      $("turn-state").textContent = "listening";
      break;
    }
    case "session_error": showError(ev.message); break;
    case "session_closed": $("turn-state").textContent = `closed: ${ev.reason}`; break;
  }
}

function waitIceGathering(peer, timeoutMs) {
  if (peer.iceGatheringState === "complete") return Promise.resolve();
  return new Promise((resolve) => {
    const t = setTimeout(resolve, timeoutMs);
    peer.addEventListener("icegatheringstatechange", () => {
      if (peer.iceGatheringState === "complete") { clearTimeout(t); resolve(); }
    });
  });
}

async function connect() {
  showError("");
  captions.reset();
  $("connect").disabled = true;
  setStatus("connecting", "connecting");
  try {
    // ?raw=1 turns off the browser's voice processing (tests with a file as the microphone)
    const raw = new URLSearchParams(location.search).get("raw") === "1";
    mic = await navigator.mediaDevices.getUserMedia({
      audio: { echoCancellation: !raw, noiseSuppression: !raw, autoGainControl: !raw, channelCount: 1 },
    });
    ctx = new AudioContext();
    await ctx.resume();
    micAnalyser = ctx.createAnalyser();
    micAnalyser.fftSize = 2048;
    ctx.createMediaStreamSource(mic).connect(micAnalyser);

    pc = new RTCPeerConnection({ iceServers: [] });
    pc.addTrack(mic.getAudioTracks()[0], mic);
    dc = pc.createDataChannel("events");
    dc.onmessage = (e) => onEvent(JSON.parse(e.data));
    pc.ontrack = (e) => {
      const stream = e.streams[0] || new MediaStream([e.track]);
      const audio = $("reply-audio") || Object.assign(document.createElement("audio"), { id: "reply-audio", autoplay: true });
      document.body.appendChild(audio);
      audio.srcObject = stream;  // Chromium feeds WebAudio from a remote stream only while it plays in an element
      audio.play().catch(() => {});
      // play as soon as packets arrive: a deep jitter buffer would keep playing after a barge-in
      if ("jitterBufferTarget" in e.receiver) e.receiver.jitterBufferTarget = 0;
      else if ("playoutDelayHint" in e.receiver) e.receiver.playoutDelayHint = 0;
      replyAnalyser = ctx.createAnalyser();
      replyAnalyser.fftSize = 512;  // ~11 ms window: the level falls soon after the audio stops
      ctx.createMediaStreamSource(stream).connect(replyAnalyser);
    };
    pc.onconnectionstatechange = () => {
      const st = pc ? pc.connectionState : "closed";
      omni.connected = st === "connected";
      setStatus(st, st === "connected" ? "connected" : st === "failed" ? "error" : "connecting");
      if (st === "failed") showError("connection failed");
    };
    await pc.setLocalDescription(await pc.createOffer());
    await waitIceGathering(pc, ICE_TIMEOUT_MS);
    const resp = await fetch(withToken("/offer"), {
      method: "POST",
      headers: { "content-type": "application/json" },
      // ?duplex=1 on the page: the duplex model (serve --duplex-model) instead of the cascade
      body: JSON.stringify({ sdp: pc.localDescription.sdp, type: "offer", ...duplexChoice() }),
    });
    const body = await resp.json();
    if (!resp.ok) throw new Error(`server refused (${resp.status}): ${body.error}`);
    omni.sessionId = body.session_id;
    await pc.setRemoteDescription({ type: "answer", sdp: body.sdp });
    startMeters();
    $("disconnect").disabled = false;
  } catch (err) {
    showError(String(err.message || err));
    await teardown();
    setStatus("error", "error");
  }
}

async function teardown() {
  clearInterval(meterTimer); clearInterval(statsTimer);
  if (dc && dc.readyState === "open") dc.send(JSON.stringify({ type: "bye" }));
  if (omni.sessionId) fetch(withToken(`/sessions/${omni.sessionId}`), { method: "DELETE" }).catch(() => {});
  if (pc) pc.close();
  if (mic) mic.getTracks().forEach((t) => t.stop());
  if (ctx) await ctx.close();
  pc = dc = mic = ctx = micAnalyser = replyAnalyser = null;
  omni.connected = false; omni.sessionId = null;
  $("connect").disabled = false; $("disconnect").disabled = true;
}

$("connect").addEventListener("click", connect);
$("disconnect").addEventListener("click", async () => { await teardown(); setStatus("disconnected", "idle"); });
window.addEventListener("pagehide", () => { if (omni.sessionId) navigator.sendBeacon?.(withToken(`/sessions/${omni.sessionId}/bye`)); });

// A server with API keys serves this page to holders of a short-lived token (POST /session-token):
// open /?token=ek_… and every API call carries it.
function duplexChoice() {
  const q = new URLSearchParams(location.search).get("duplex");
  return q === null ? {} : { duplex: q === "1" || q === "true" };
}

function withToken(path) {
  const token = new URLSearchParams(location.search).get("token");
  return token ? `${path}${path.includes("?") ? "&" : "?"}token=${encodeURIComponent(token)}` : path;
}
