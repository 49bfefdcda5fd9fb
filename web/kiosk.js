// The kiosk's conversation logic: session events → state (idle, listening, thinking, speaking,
// interrupted), captions, attract screen, privacy reset after idle, push-to-talk, and the greeting.
// State a test can read lives on window.kiosk.
"use strict";

const DEFAULTS = {
  title: "omniduplex", greeting: "Hello! Ask me anything: just start talking.", turn_detection: "silence",
  idle_timeout_s: 60, attract_after_s: 20, push_to_talk: false, reconnect_max_s: 15,
  colors: { background: "#0b1020", surface: "#161d36", text: "#f5f7ff", accent: "#5eead4" },
};
const INTERRUPTED_MS = 1500;  // how long "interrupted" shows before the visual goes back to listening
const SILENT = 1e-4;          // reply peak below which the reply audio counts as stopped
const TICK_MS = 250;          // idle timers

const kiosk = (window.kiosk = {
  state: "idle", stateLog: [], events: [], config: null, link: null, sessionId: null,
  micLevel: 0, replyLevel: 0, replyLevelMax: 0, heardStopMs: [],
  attract: false, engaged: false, resets: 0, greets: 0, pttHeld: false,
  captionsText: () => "",
});

/** The server's settings, then URL overrides for this screen (?ptt, ?idle_timeout, ?attract_after). */
async function loadConfig() {
  let cfg = { ...DEFAULTS };
  try {
    const r = await fetch(withToken("kiosk/config.json"), { cache: "no-store" });
    if (r.ok) cfg = { ...cfg, ...(await r.json()) };
  } catch (err) { /* server down at boot: defaults now, the server's once connected */ }
  const q = new URLSearchParams(location.search);
  if (q.has("ptt")) cfg.push_to_talk = q.get("ptt") === "1";
  if (q.has("idle_timeout")) cfg.idle_timeout_s = Number(q.get("idle_timeout"));
  if (q.has("attract_after")) cfg.attract_after_s = Number(q.get("attract_after"));
  return cfg;
}

function peak(analyser, buf) {
  analyser.getFloatTimeDomainData(buf);
  let m = 0;
  for (let i = 0; i < buf.length; i++) { const a = Math.abs(buf[i]); if (a > m) m = a; }
  return m;
}

/** Peak amplitude → 0…1 on a -60…0 dBFS scale. */
function loudness(p) { return Math.max(0, Math.min(1, (20 * Math.log10(p + 1e-9) + 60) / 60)); }

async function main() {
  const view = new KioskView(document);
  const captions = new OmniCaptions(document.getElementById("captions"), { maxTurns: 2 });
  kiosk.captionsText = () => captions.text();
  let cfg = (kiosk.config = await loadConfig());
  view.applyConfig(cfg);

  const audioEl = document.getElementById("reply-audio");
  const ctx = new AudioContext();
  let micAnalyser = null, micSource = null, replyAnalyser = null, replySource = null, bargeAt = null, interruptTimer = null;
  let lastActivity = performance.now(), level = 0;

  const setState = (s) => {
    if (s === kiosk.state) return;
    kiosk.state = s;
    kiosk.stateLog.push({ state: s, t: Math.round(performance.now()) });
    view.setState(s);
  };
  const activity = () => { lastActivity = performance.now(); };
  const showAttract = (on) => { kiosk.attract = on; view.showAttract(on); };

  /** Someone is here: leave the attract screen; with `greet`, ask the assistant to welcome them. */
  const wake = (greet) => {
    activity();
    if (!kiosk.attract) return;
    showAttract(false);
    if (greet && link.send({ type: "greet" })) kiosk.greets += 1;
  };

  /** Privacy: forget the conversation on screen and on the server (a fresh session), back to attract. */
  const resetConversation = () => {
    captions.reset();
    kiosk.events.length = 0;  // nothing of the last visitor stays in the page either
    kiosk.engaged = false;
    kiosk.resets += 1;
    clearTimeout(interruptTimer);
    setState("idle");
    showAttract(true);
    activity();
    link.restart();
  };

  const onEvent = (ev) => {
    kiosk.events.push(ev);
    if (kiosk.events.length > 2000) kiosk.events.splice(0, 1000);  // runs for days: keep memory bounded
    if (kiosk.stateLog.length > 500) kiosk.stateLog.splice(0, 250);
    captions.handle(ev);
    const s = kiosk.state;
    switch (ev.type) {
      case "session_started": setState(kiosk.engaged ? "listening" : "idle"); break;
      case "user_speech_started":
        wake(false);
        if (s === "idle" || s === "listening") setState("listening");
        break;
      case "user_turn_committed": activity(); kiosk.engaged = true; setState("thinking"); break;
      case "reply_started": activity(); kiosk.engaged = true; if (s !== "speaking") setState("thinking"); break;
      case "reply_audio_started": activity(); setState("speaking"); break;
      case "reply_text": case "reply_spoken": case "user_transcript": case "user_transcript_partial":
        activity(); break;
      case "barge_in":
        activity();
        bargeAt = performance.now();
        setState("interrupted");
        clearTimeout(interruptTimer);
        interruptTimer = setTimeout(() => { if (kiosk.state === "interrupted") setState("listening"); }, INTERRUPTED_MS);
        break;
      case "reply_ended":
        activity();
        if (ev.reason !== "interrupted" && (s === "thinking" || s === "speaking")) setState("listening");
        break;
    }
  };

  const link = new KioskLink({
    onEvent,
    onStatus: async (st) => {
      kiosk.link = { ...st };
      kiosk.sessionId = st.phase === "live" ? link.sessionId : null;
      view.showLink(st);
      if (st.phase === "waiting" && (kiosk.state === "thinking" || kiosk.state === "speaking")) {
        setState(kiosk.engaged ? "listening" : "idle");
      }
      if (st.phase === "live") {  // the server may have restarted with new settings
        const fresh = await loadConfig();
        if (JSON.stringify(fresh) !== JSON.stringify(cfg)) {
          cfg = kiosk.config = fresh;
          view.applyConfig(cfg);
          link.setMicEnabled(!cfg.push_to_talk || kiosk.pttHeld);
        }
      }
    },
    onMic: (stream) => {
      if (micSource) micSource.disconnect();
      micAnalyser = ctx.createAnalyser();
      micAnalyser.fftSize = 1024;
      micSource = ctx.createMediaStreamSource(stream);
      micSource.connect(micAnalyser);
    },
    onReplyStream: (stream, receiver) => {
      audioEl.srcObject = stream;  // Chromium feeds WebAudio from a remote stream only while an element plays it
      audioEl.play().catch(() => view.showSoundHint(true));
      // play as soon as packets arrive: a deep jitter buffer would keep talking after a barge-in
      if ("jitterBufferTarget" in receiver) receiver.jitterBufferTarget = 0;
      if (replySource) replySource.disconnect();
      replyAnalyser = ctx.createAnalyser();
      replyAnalyser.fftSize = 512;
      replySource = ctx.createMediaStreamSource(stream);
      replySource.connect(replyAnalyser);
    },
  }, {
    raw: new URLSearchParams(location.search).get("raw") === "1",
    reconnectMaxMs: 1000 * cfg.reconnect_max_s,
    micEnabled: !cfg.push_to_talk,
    duplex: !!cfg.duplex,
  });

  // -- levels: the visual swells with the mic while listening, with the reply while speaking ----------
  const mbuf = new Float32Array(1024), rbuf = new Float32Array(512);
  setInterval(() => {
    kiosk.micLevel = micAnalyser ? peak(micAnalyser, mbuf) : 0;
    kiosk.replyLevel = replyAnalyser ? peak(replyAnalyser, rbuf) : 0;
    kiosk.replyLevelMax = Math.max(kiosk.replyLevelMax, kiosk.replyLevel);
    if (bargeAt !== null && kiosk.replyLevel < SILENT) {
      kiosk.heardStopMs.push(performance.now() - bargeAt);
      bargeAt = null;
    }
    const src = kiosk.state === "listening" ? kiosk.micLevel : kiosk.state === "speaking" ? kiosk.replyLevel : 0;
    const target = loudness(src);
    level = target > level ? target : level * 0.85 + target * 0.15;  // fast attack, slow release
    view.setLevel(level);
  }, 20);

  // -- idle: attract screen, then the privacy reset ----------------------------------------------------
  setInterval(() => {
    const now = performance.now();
    if (kiosk.state === "thinking" || kiosk.state === "speaking" || kiosk.pttHeld) activity();
    const idleS = (now - lastActivity) / 1000;
    if (kiosk.engaged && idleS > cfg.idle_timeout_s) resetConversation();
    else if (!kiosk.engaged && !kiosk.attract && kiosk.state === "idle" && idleS > cfg.attract_after_s) showAttract(true);
  }, TICK_MS);

  // -- touch, keys: waking, push-to-talk, unlocking audio -----------------------------------------------
  const unlockAudio = () => {
    if (ctx.state === "suspended") ctx.resume();
    audioEl.play().then(() => view.showSoundHint(false)).catch(() => {});
  };
  const press = () => {
    if (!cfg.push_to_talk || kiosk.pttHeld) return;
    kiosk.pttHeld = true;
    link.setMicEnabled(true);
    view.setHeld(true);
    activity();
    if (kiosk.state === "idle") setState("listening");
  };
  const release = () => {
    if (!kiosk.pttHeld) return;
    kiosk.pttHeld = false;
    link.setMicEnabled(false);
    view.setHeld(false);
    activity();
  };
  document.addEventListener("pointerdown", (e) => {
    unlockAudio();
    if (kiosk.attract) { wake(true); e.preventDefault(); return; }
    press();
  });
  for (const type of ["pointerup", "pointercancel"]) document.addEventListener(type, release);
  window.addEventListener("blur", release);
  document.addEventListener("keydown", (e) => {
    if (e.code !== "Space" || e.repeat) return;
    e.preventDefault();
    unlockAudio();
    if (kiosk.attract) wake(!cfg.push_to_talk);
    press();
  });
  document.addEventListener("keyup", (e) => { if (e.code === "Space") release(); });
  document.addEventListener("contextmenu", (e) => e.preventDefault());  // touch and hold must not open a menu
  window.addEventListener("pagehide", () => link.hangUp());

  // without a gesture (and without --autoplay-policy=no-user-gesture-required) resume() never settles
  await Promise.race([ctx.resume().catch(() => {}), new Promise((r) => setTimeout(r, 500))]);
  if (ctx.state === "suspended") view.showSoundHint(true);
  link.start();
  window.kioskLink = link;
}

main();
