// The kiosk's link to the server, kept up without anyone at the keyboard: microphone → WebRTC
// (POST offer, Opus 48 kHz) → session events on a data channel. It retries with exponential backoff
// (0.5 s doubling, capped, ±20 % jitter) and names the cause while it waits:
//   "no-mic" (no capture device), "denied" (microphone permission refused), "insecure" (no https),
//   "full" (503 or 429 from /offer), "starting" (503 while /readyz says the pipeline is not up yet),
//   "auth" (401/403: the URL's ?token= is missing or refused),
//   "offline" (server unreachable or connection lost), "error" (anything else).
// A server with API keys needs ?token=KEY on the page's URL; every API call carries it (withToken).
// A lost link is noticed by the peer connection failing, staying "disconnected" for DISCONNECT_GRACE_MS,
// the data channel closing, the server saying `session_closed`, or two failed /healthz polls in a row.
"use strict";

const OFFER_TIMEOUT_MS = 10000;     // POST /offer (includes ICE gathering on the server)
const ICE_GATHER_MS = 3000;         // give up waiting for local candidates after this long
const CONNECT_TIMEOUT_MS = 15000;   // answer applied → connectionState "connected"
const DISCONNECT_GRACE_MS = 3000;   // "disconnected" this long counts as lost
const HEALTH_EVERY_MS = 2000;       // /healthz poll period while live
const HEALTH_TIMEOUT_MS = 1500;
const STABLE_MS = 10000;            // live this long: the next loss retries from the shortest delay
const BACKOFF_MIN_MS = 500;

/** `path` with the page's ?token= (servers with API keys; app/host/auth.py), if it has one. */
function withToken(path) {
  const token = new URLSearchParams(location.search).get("token");
  return token ? `${path}${path.includes("?") ? "&" : "?"}token=${encodeURIComponent(token)}` : path;
}

class LinkProblem extends Error {
  constructor(kind, message) { super(message); this.kind = kind; }
}

/** Why getUserMedia failed, as a problem kind. */
function micProblem(err) {
  const name = (err && err.name) || "";
  if (name === "NotAllowedError" || name === "SecurityError") return new LinkProblem("denied", err.message || name);
  return new LinkProblem("no-mic", err.message || name || "no microphone");
}

function withTimeout(promise, ms, what) {
  let t;
  const timeout = new Promise((_, reject) => { t = setTimeout(() => reject(new LinkProblem("offline", `${what} timed out`)), ms); });
  return Promise.race([promise, timeout]).finally(() => clearTimeout(t));
}

class KioskLink {
  /**
   * hooks: onEvent(ev) for each session event; onStatus({phase, problem, message, retryAt, attempt})
   * on every change (phase: "starting" | "connecting" | "live" | "waiting"); onMic(stream) when a
   * microphone is acquired; onReplyStream(stream) when the reply audio track arrives.
   * opts: {raw: no browser voice processing, reconnectMaxMs, micEnabled, duplex: run the server's duplex
   * model (kiosk.duplex in config.json) instead of the cascade}.
   */
  constructor(hooks, opts = {}) {
    this.hooks = hooks;
    this.raw = !!opts.raw;
    this.maxDelayMs = opts.reconnectMaxMs || 15000;
    this.micEnabled = opts.micEnabled !== false;
    this.duplex = !!opts.duplex;
    this.mic = null; this.pc = null; this.dc = null; this.sessionId = null;
    this.attempt = 0; this.liveSince = 0; this.generation = 0;
    this.timers = new Set();
    this.status = { phase: "starting", problem: null, message: "", retryAt: null, attempt: 0 };
    this.sessionsOpened = 0;
  }

  start() { this.watchMicCauses(); this.connect(); }

  /** Tear down and open a fresh session now (idle reset): no backoff, no problem shown. */
  restart() {
    this.teardown(true);
    this.attempt = 0;
    this.connect();
  }

  send(msg) {
    if (this.dc && this.dc.readyState === "open") { this.dc.send(JSON.stringify(msg)); return true; }
    return false;
  }

  /** Push-to-talk: a disabled track sends silence, so the server hears (and commits) only while held. */
  setMicEnabled(on) {
    this.micEnabled = on;
    if (this.mic) this.mic.getAudioTracks().forEach((t) => { t.enabled = on; });
  }

  setStatus(patch) {
    this.status = { ...this.status, ...patch };
    this.hooks.onStatus(this.status);
  }

  later(fn, ms) {
    const t = setTimeout(() => { this.timers.delete(t); fn(); }, ms);
    this.timers.add(t);
    return t;
  }

  async ensureMic() {
    if (this.mic && this.mic.getAudioTracks().some((t) => t.readyState === "live")) return this.mic;
    if (!navigator.mediaDevices || !navigator.mediaDevices.getUserMedia) {
      throw new LinkProblem("insecure", "the microphone needs https (or localhost)");
    }
    let stream;
    try {
      stream = await navigator.mediaDevices.getUserMedia({
        audio: { echoCancellation: !this.raw, noiseSuppression: !this.raw, autoGainControl: !this.raw, channelCount: 1 },
      });
    } catch (err) {
      throw micProblem(err);
    }
    const track = stream.getAudioTracks()[0];
    if (!track) throw new LinkProblem("no-mic", "no audio track");
    track.enabled = this.micEnabled;
    track.addEventListener("ended", () => this.lost("no-mic", "the microphone went away"));
    this.mic = stream;
    this.hooks.onMic(stream);
    return stream;
  }

  async connect() {
    const gen = ++this.generation;
    this.setStatus({ phase: "connecting", retryAt: null });
    try {
      const mic = await this.ensureMic();
      if (gen !== this.generation) return;
      const pc = (this.pc = new RTCPeerConnection({ iceServers: [] }));
      pc.addTrack(mic.getAudioTracks()[0], mic);
      const dc = (this.dc = pc.createDataChannel("events"));
      dc.onmessage = (e) => { if (gen === this.generation) this.onMessage(e.data); };
      dc.onclose = () => { if (gen === this.generation && this.status.phase === "live") this.lost("offline", "event channel closed"); };
      pc.ontrack = (e) => this.hooks.onReplyStream(e.streams[0] || new MediaStream([e.track]), e.receiver);
      const connected = new Promise((resolve, reject) => {
        pc.onconnectionstatechange = () => {
          if (gen !== this.generation) return;
          const st = pc.connectionState;
          if (st === "connected") { clearTimeout(this.graceTimer); resolve(); }
          if (st === "failed" || st === "closed") { reject(new LinkProblem("offline", `connection ${st}`)); this.lost("offline", `connection ${st}`); }
          if (st === "disconnected") {
            clearTimeout(this.graceTimer);
            this.graceTimer = this.later(() => { if (pc.connectionState === "disconnected") this.lost("offline", "connection lost"); }, DISCONNECT_GRACE_MS);
          }
        };
      });
      connected.catch(() => {});
      await pc.setLocalDescription(await pc.createOffer());
      await this.iceGathered(pc);
      const body = await this.postOffer(pc.localDescription.sdp);
      if (gen !== this.generation) return;
      this.sessionId = body.session_id;
      await pc.setRemoteDescription({ type: "answer", sdp: body.sdp });
      await withTimeout(connected, CONNECT_TIMEOUT_MS, "connection");
      if (gen !== this.generation) return;
      this.sessionsOpened += 1;
      this.liveSince = performance.now();
      this.setStatus({ phase: "live", problem: null, message: "", attempt: this.attempt });
      this.watchHealth(gen);
    } catch (err) {
      if (gen !== this.generation) return;
      const p = err instanceof LinkProblem ? err : new LinkProblem("error", String((err && err.message) || err));
      this.lost(p.kind, p.message);
    }
  }

  iceGathered(pc) {
    if (pc.iceGatheringState === "complete") return Promise.resolve();
    return new Promise((resolve) => {
      const t = setTimeout(resolve, ICE_GATHER_MS);
      pc.addEventListener("icegatheringstatechange", () => {
        if (pc.iceGatheringState === "complete") { clearTimeout(t); resolve(); }
      });
    });
  }

  async postOffer(sdp) {
    const ctl = new AbortController();
    const t = setTimeout(() => ctl.abort(), OFFER_TIMEOUT_MS);
    let resp;
    try {
      resp = await fetch(withToken("offer"), {
        method: "POST", headers: { "content-type": "application/json" },
        body: JSON.stringify({ sdp, type: "offer", duplex: this.duplex }), signal: ctl.signal, cache: "no-store",
      });
    } catch (err) {
      throw new LinkProblem("offline", "server unreachable");
    } finally {
      clearTimeout(t);
    }
    let body = {};
    try { body = await resp.json(); } catch (err) { /* a proxy's HTML error page */ }
    if (resp.status === 503) {
      const ready = await fetch("readyz", { cache: "no-store" }).then((r) => r.ok, () => false);
      throw new LinkProblem(ready ? "full" : "starting", body.error || "server is full");
    }
    if (resp.status === 429) throw new LinkProblem("full", body.error || "too many connections");
    if (resp.status === 401 || resp.status === 403) throw new LinkProblem("auth", body.error || `HTTP ${resp.status}`);
    if (!resp.ok) throw new LinkProblem(resp.status >= 500 ? "offline" : "error", body.error || `HTTP ${resp.status}`);
    return body;
  }

  onMessage(data) {
    let ev;
    try { ev = JSON.parse(data); } catch (err) { return; }
    this.hooks.onEvent(ev);
    if (ev.type === "session_closed") this.lost("offline", `session closed: ${ev.reason}`);
  }

  watchHealth(gen) {
    let failures = 0;
    const poll = async () => {
      if (gen !== this.generation) return;
      const ctl = new AbortController();
      const t = setTimeout(() => ctl.abort(), HEALTH_TIMEOUT_MS);
      try {
        const r = await fetch("healthz", { cache: "no-store", signal: ctl.signal });
        failures = r.ok ? 0 : failures + 1;
      } catch (err) {
        failures += 1;
      } finally {
        clearTimeout(t);
      }
      if (gen !== this.generation) return;
      if (failures >= 2) this.lost("offline", "server unreachable");
      else this.later(poll, HEALTH_EVERY_MS);
    };
    this.later(poll, HEALTH_EVERY_MS);
  }

  /** The link is down for `kind`: tear down and try again after the backoff delay. */
  lost(kind, message) {
    const wasLive = this.status.phase === "live";
    if (this.status.phase === "waiting") return;  // already scheduled
    this.generation += 1;
    this.teardown(wasLive);
    if (kind === "no-mic" && this.mic) { this.mic.getTracks().forEach((t) => t.stop()); this.mic = null; }
    if (wasLive && performance.now() - this.liveSince > STABLE_MS) this.attempt = 0;
    const base = Math.min(this.maxDelayMs, BACKOFF_MIN_MS * 2 ** this.attempt);
    const delay = Math.round(base * (0.8 + 0.4 * Math.random()));
    this.attempt += 1;
    this.setStatus({ phase: "waiting", problem: kind, message, retryAt: Date.now() + delay, attempt: this.attempt });
    this.later(() => this.connect(), delay);
  }

  /** Close the peer (saying bye when `polite` and possible); the microphone is kept for the next try. */
  teardown(polite) {
    this.timers.forEach((t) => clearTimeout(t));
    this.timers.clear();
    if (polite && this.dc && this.dc.readyState === "open") {
      try { this.dc.send(JSON.stringify({ type: "bye" })); } catch (err) { /* closing anyway */ }
    }
    if (polite && this.sessionId) fetch(withToken(`sessions/${this.sessionId}`), { method: "DELETE" }).catch(() => {});
    if (this.pc) { this.pc.onconnectionstatechange = null; this.pc.close(); }
    this.pc = this.dc = null;
    this.sessionId = null;
  }

  /** Try again at once if waiting on `kinds` (e.g. a microphone was plugged in, permission granted). */
  retryNow(kinds) {
    if (this.status.phase !== "waiting" || !kinds.includes(this.status.problem)) return;
    this.timers.forEach((t) => clearTimeout(t));
    this.timers.clear();
    this.connect();
  }

  /** Retry at once when the cause of a microphone problem goes away (where the browser says so). */
  watchMicCauses() {
    navigator.mediaDevices?.addEventListener?.("devicechange", () => this.retryNow(["no-mic"]));
    navigator.permissions?.query({ name: "microphone" }).then((st) => {
      st.onchange = () => { if (st.state !== "denied") this.retryNow(["denied"]); };
    }).catch(() => {});
  }

  /** Page is going away: hang up without waiting. */
  hangUp() {
    if (this.sessionId) navigator.sendBeacon?.(withToken(`sessions/${this.sessionId}/bye`));
  }
}

window.KioskLink = KioskLink;
window.withToken = withToken;
