// What the kiosk shows: the state visual and its label, the attract screen, the problem screens and the
// branding. No logic about sessions here: kiosk.js decides, this draws.
"use strict";

const STATE_TEXT = {
  idle: ["Say something to start", "Hold the space bar or touch and hold to talk"],
  listening: ["Listening…", "Hold to talk"],
  thinking: ["Thinking…", "Thinking…"],
  speaking: ["Speaking", "Speaking"],
  interrupted: ["Interrupted: go ahead", "Interrupted: go ahead"],
};
const HINT_TEXT = {
  idle: ["Just start talking", "Push-to-talk: hold the space bar, or touch and hold the screen"],
  listening: ["Your turn: just talk, and pause when you're done", "Hold to talk, release when you're done"],
  thinking: ["", ""],
  speaking: ["Talk over me to interrupt", "Hold to interrupt"],
  interrupted: ["", ""],
};
const PROBLEM_TEXT = {
  "no-mic": ["No microphone found", "Plug in a microphone. This screen starts again by itself."],
  denied: ["Microphone access is blocked", "Allow the microphone for this page in the browser's site settings. This screen starts again by itself."],
  insecure: ["This page needs a secure connection", "Open the kiosk over https, or on this machine at localhost."],
  full: ["All voice lines are busy", "The assistant is talking to as many people as it can right now."],
  starting: ["The assistant is starting", "Loading the speech models. This screen starts by itself when they are ready."],
  auth: ["This screen is not allowed in", "The server needs an access key: open the kiosk with ?\u2060token=KEY in its address."],
  offline: ["Reconnecting to the assistant", "The server cannot be reached right now."],
  error: ["Something went wrong", ""],
};

class KioskView {
  constructor(doc) {
    this.doc = doc;
    this.$ = (id) => doc.getElementById(id);
    this.ptt = false;
    this.held = false;
    this.retryTimer = null;
  }

  /** Title, greeting and colours from the server's kiosk settings. */
  applyConfig(cfg) {
    const root = this.doc.documentElement.style;
    for (const [k, v] of Object.entries(cfg.colors || {})) root.setProperty(`--${k}`, v);
    this.doc.title = cfg.title;
    this.$("title").textContent = cfg.title;
    this.$("attract-title").textContent = cfg.title;
    this.$("greeting").textContent = cfg.greeting;
    this.ptt = !!cfg.push_to_talk;
    this.$("attract-cta").textContent = this.ptt ? "Tap the screen to start" : "Tap the screen or just say hello";
    this.doc.body.classList.toggle("ptt", this.ptt);
    this.setState(this.doc.body.dataset.state);
  }

  setState(state) {
    this.doc.body.dataset.state = state;
    const i = this.ptt ? 1 : 0;
    let label = STATE_TEXT[state][i];
    if (state === "listening" && this.ptt && this.held) label = "Listening…";
    this.$("state-label").textContent = label;
    this.$("hint").textContent = HINT_TEXT[state][i];
    this.$("visual").setAttribute("aria-label", `assistant is ${state}`);
  }

  setHeld(held) {
    this.held = held;
    this.doc.body.classList.toggle("holding", held);
    this.setState(this.doc.body.dataset.state);
  }

  /** 0…1: how far the visual swells (the mic level while listening, the reply level while speaking). */
  setLevel(x) {
    this.$("visual").style.setProperty("--level", x.toFixed(3));
  }

  showAttract(on) {
    this.$("attract").hidden = !on;
    this.screen();
  }

  showSoundHint(on) { this.$("sound-hint").hidden = !on; }

  /** The link status: a problem screen while the link is down for a named cause, else nothing. */
  showLink(status) {
    const link = this.$("link");
    link.dataset.phase = status.phase;
    link.textContent = { starting: "starting…", connecting: "connecting…", live: "connected", waiting: "offline" }[status.phase];
    const show = status.problem && status.phase !== "live";
    this.$("problem").hidden = !show;
    this.doc.body.dataset.problem = show ? status.problem : "";
    clearInterval(this.retryTimer);
    if (show) {
      const [title, text] = PROBLEM_TEXT[status.problem] || PROBLEM_TEXT.error;
      this.$("problem-title").textContent = title;
      this.$("problem-text").textContent = text || status.message;
      const tick = () => {
        const s = status.retryAt ? Math.max(0, Math.ceil((status.retryAt - Date.now()) / 1000)) : 0;
        this.$("problem-retry").textContent = status.phase === "connecting" || s === 0 ? "Trying again now…" : `Trying again in ${s} s`;
      };
      tick();
      this.retryTimer = setInterval(tick, 250);
    }
    this.screen();
  }

  /** Which full screen is up: problem > attract > stage (for styling and tests). */
  screen() {
    const b = this.doc.body;
    b.dataset.screen = !this.$("problem").hidden ? "problem" : !this.$("attract").hidden ? "attract" : "stage";
  }
}

window.KioskView = KioskView;
