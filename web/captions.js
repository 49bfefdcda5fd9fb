// Live captions from a session's events, shared by the voice chat page (/) and the kiosk (/kiosk).
// The user's line is what the ASR heard while they spoke (`user_transcript_partial`, replaced as it grows),
// then the turn's transcript (`user_transcript`); the assistant's line grows
// clause by clause as each clause's audio starts playing (`reply_spoken`), so the words on screen are
// the words being heard, never the generation-time text (`reply_text`) that runs ahead of the audio.
// New words are appended as text nodes, so an aria-live region announces only what is new.
// A tool call the server runs shows beside them while it runs: the tool's name, then done or failed
// (`tool_call` with its `phase`, `function_call_output`).
"use strict";

class OmniCaptions {
  /** root: the (aria-live) element to fill; maxTurns: turns kept on screen (older ones are removed). */
  constructor(root, { maxTurns = 2, labels = { user: "You", assistant: "Assistant" } } = {}) {
    this.root = root;
    this.maxTurns = maxTurns;
    this.labels = labels;
    this.turns = new Map(); // turn_id → {el, user, assistant}
  }

  /** Feed one session event; events that carry no caption are ignored. */
  handle(ev) {
    switch (ev.type) {
      case "user_transcript_partial": this.line(ev.turn_id, "user", ev.text || "…", true, true); break;
      case "user_turn_committed":  // keep what the partial transcripts showed, if any
        if (!this.turns.get(ev.turn_id)?.user) this.line(ev.turn_id, "user", "…", true);
        break;
      case "user_transcript": this.line(ev.turn_id, "user", ev.text || "(no words heard)", true); break;
      case "reply_spoken": this.line(ev.turn_id, "assistant", ev.text, false); break;
      case "barge_in": this.markInterrupted(ev.turn_id); break;
      case "reply_ended": if (ev.reason === "interrupted") this.markInterrupted(ev.turn_id); break;
      case "tool_call":
        if (ev.phase === "started") this.tool(ev.turn_id, ev.call_id, ev.name, "running");
        else if (ev.phase === "failed") this.tool(ev.turn_id, ev.call_id, ev.name, "failed");
        break;
      case "function_call_output": this.tool(ev.turn_id, ev.call_id, ev.name, ev.error ? "failed" : "done"); break;
    }
  }

  /** Show tool call `callId` of a turn (`state`: running, done or failed), one line per call. */
  tool(turnId, callId, name, state) {
    const t = this.turn(turnId);
    let p = t.el.querySelector(`.cap.tool[data-call="${CSS.escape(callId)}"]`);
    if (!p) {
      p = document.createElement("p");
      p.className = "cap tool";
      p.dataset.call = callId;
      if (t.assistant) t.el.insertBefore(p, t.assistant.p); else t.el.appendChild(p);
    }
    p.dataset.state = state;
    p.textContent = `⚙ ${name}: ${state === "running" ? "checking…" : state}`;
  }

  /** Clear every caption (privacy reset, new connection). */
  reset() {
    this.turns.clear();
    this.root.replaceChildren();
  }

  /** The captions as plain text, one line per speaker line ("You: …"), oldest first. */
  text() {
    return [...this.root.querySelectorAll(".cap")].map((p) => p.textContent.replace(/\s+/g, " ").trim()).join("\n");
  }

  turn(turnId) {
    let t = this.turns.get(turnId);
    if (!t) {
      const el = document.createElement("div");
      el.className = "cap-turn";
      el.dataset.turn = turnId;
      this.root.appendChild(el);
      t = { el, user: null, assistant: null };
      this.turns.set(turnId, t);
      while (this.turns.size > this.maxTurns) {
        const [oldest] = this.turns.keys();
        this.turns.get(oldest).el.remove();
        this.turns.delete(oldest);
      }
    }
    return t;
  }

  /** Set (replace) or extend (append) the `role` line of a turn; `partial`: words that may still change
   * (styled `.partial` until a final line replaces them). */
  line(turnId, role, text, replace, partial = false) {
    const t = this.turn(turnId);
    if (!t[role]) {
      const p = document.createElement("p");
      p.className = `cap ${role}`;
      const who = document.createElement("span");
      who.className = "who";
      who.textContent = `${this.labels[role]}: `;
      const words = document.createElement("span");
      words.className = "words";
      p.append(who, words);
      if (role === "user" && t.assistant) t.el.insertBefore(p, t.assistant.p); else t.el.appendChild(p);
      t[role] = { p, words };
    }
    const { words } = t[role];
    t[role].p.classList.toggle("partial", partial);
    if (replace) words.textContent = text;
    else {  // clause texts may come stripped (the cascade's TTS): one space between clauses
      const sep = words.textContent && !/\s$/.test(words.textContent) && !/^\s/.test(text) ? " " : "";
      words.appendChild(document.createTextNode(sep + text));
    }
  }

  markInterrupted(turnId) {
    const t = this.turns.get(turnId);
    if (!t || !t.assistant || t.assistant.p.classList.contains("interrupted")) return;
    t.assistant.p.classList.add("interrupted");
    const mark = document.createElement("span");
    mark.className = "cut";
    mark.textContent = " (interrupted)";
    t.assistant.p.appendChild(mark);
  }
}

window.OmniCaptions = OmniCaptions;
