"""The demo kiosk's settings: a full-screen, hands-free voice station at ``/kiosk``.

:class:`KioskConfig` comes from the ``kiosk:`` section of a server config file (YAML) and from
``omniduplex kiosk`` flags; the page reads its public part from ``GET /kiosk/config.json``
(:func:`page_config`), the server applies the rest (system prompt, voice, turn detection) to its
sessions (:func:`omniduplex.app.server.kiosk_server_config`); the greeting itself is spoken by the core
(:mod:`omniduplex.app.core.greeting`). Example::

    kiosk:
      title: Ask the museum
      greeting: Welcome! Ask me anything about the exhibits.
      system_prompt: You are the museum's guide. Answer in one or two short sentences.
      voice: ethan
      turn_detection: smart        # silence | smart (app.core.vad.TurnConfig.turn_detection)
      idle_timeout_s: 60           # reset the conversation and captions after this long without activity
      attract_after_s: 20          # show the attract screen after this long idle
      push_to_talk: false          # true: hold the space bar or touch and hold to talk
      reconnect_max_s: 15          # longest wait between reconnection attempts
      duplex: false                # true: the duplex model (serve --duplex-model) instead of the cascade
      colors: {background: "#0b1020", surface: "#161d36", text: "#f5f7ff", accent: "#5eead4"}

Colours are checked for legibility (WCAG 2.1): caption and label text ≥ 4.5:1 against the background
and the caption panel, the state visual ≥ 3:1 against the background.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path

import yaml

TEXT_CONTRAST = 4.5
"""Minimum contrast ratio of text against what is behind it (WCAG 2.1 AA, normal text)."""
GRAPHIC_CONTRAST = 3.0
"""Minimum contrast ratio of the state visual against the background (WCAG 2.1 non-text contrast)."""

_HEX = re.compile(r"^#([0-9a-fA-F]{3}|[0-9a-fA-F]{6})$")


@dataclass
class KioskColors:
    """Branding colours as ``#rrggbb`` (or ``#rgb``): page ``background``, caption panel ``surface``,
    all ``text``, and the ``accent`` of the state visual."""

    background: str = "#0b1020"
    surface: str = "#161d36"
    text: str = "#f5f7ff"
    accent: str = "#5eead4"


@dataclass
class KioskConfig:
    """Everything the kiosk can be told. Times in seconds.

    Attributes:
        title: shown at the top of the page and on the attract screen.
        greeting: shown on the attract screen, and what the assistant is asked to say when a visitor taps it.
        system_prompt: the assistant's system prompt for kiosk sessions (``None`` = the server's).
        voice: the TTS voice / speaker key (``None`` = the server's).
        turn_detection: ``"silence"`` or ``"smart"`` (:class:`~omniduplex.app.core.vad.TurnConfig`).
        idle_timeout_s: without activity for this long, the page clears the captions and starts a fresh
            session (privacy: the next visitor sees and continues nothing).
        attract_after_s: idle for this long, the page shows the attract screen.
        push_to_talk: the page sends silence unless the space bar or the screen is held.
        reconnect_max_s: the page's reconnection backoff (0.5 s, doubling) stops growing here.
        colors: :class:`KioskColors`.
        duplex: the page's sessions run the duplex model (``serve --duplex-model DIR``; also set by
            ``--duplex-surfaces kiosk``) instead of the cascade: the page asks for it in its offer.

    Raises:
        ValueError: a value out of range, a malformed colour, or colours too close to read.
    """

    title: str = "omniduplex"
    greeting: str = "Hello! I'm a voice assistant. Ask me anything: just start talking."
    system_prompt: str | None = None
    voice: str | None = None
    turn_detection: str = "silence"
    idle_timeout_s: float = 60.0
    attract_after_s: float = 20.0
    push_to_talk: bool = False
    reconnect_max_s: float = 15.0
    colors: KioskColors = field(default_factory=KioskColors)
    duplex: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.colors, dict):
            self.colors = _build(KioskColors, self.colors, "kiosk.colors")
        if self.turn_detection not in ("silence", "smart"):
            raise ValueError(f"kiosk.turn_detection: 'silence' or 'smart', not {self.turn_detection!r}")
        for name in ("idle_timeout_s", "attract_after_s", "reconnect_max_s"):
            if not float(getattr(self, name)) > 0:
                raise ValueError(f"kiosk.{name} must be > 0 s")
        if not self.greeting.strip():
            raise ValueError("kiosk.greeting must not be empty")
        check_colors(self.colors)


def _build(cls, values: dict, where: str):
    """``cls(**values)`` with unknown keys reported by name (a typo must not pass silently)."""
    known = {f.name for f in fields(cls)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise ValueError(f"{where}: unknown key(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
    return cls(**values)


def relative_luminance(color: str) -> float:
    """WCAG 2.1 relative luminance (0 = black … 1 = white) of ``#rgb`` / ``#rrggbb``.

    Raises:
        ValueError: not a hex colour.
    """
    m = _HEX.match(color.strip())
    if not m:
        raise ValueError(f"colour must be #rgb or #rrggbb, got {color!r}")
    h = m.group(1)
    if len(h) == 3:
        h = "".join(c * 2 for c in h)
    channels = [int(h[i : i + 2], 16) / 255.0 for i in (0, 2, 4)]
    lin = [c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4 for c in channels]
    return 0.2126 * lin[0] + 0.7152 * lin[1] + 0.0722 * lin[2]


def contrast_ratio(a: str, b: str) -> float:
    """WCAG contrast ratio of two colours, 1.0 (same) … 21.0 (black on white); symmetric."""
    la, lb = sorted((relative_luminance(a), relative_luminance(b)), reverse=True)
    return (la + 0.05) / (lb + 0.05)


def check_colors(c: KioskColors) -> None:
    """Raise ``ValueError`` naming the pair when text or the state visual would be hard to see."""
    pairs = [
        ("text", "background", TEXT_CONTRAST),
        ("text", "surface", TEXT_CONTRAST),
        ("accent", "background", GRAPHIC_CONTRAST),
    ]
    for fg, bg, need in pairs:
        r = contrast_ratio(getattr(c, fg), getattr(c, bg))
        if r < need:
            raise ValueError(
                f"kiosk.colors: {fg} {getattr(c, fg)} on {bg} {getattr(c, bg)} has contrast {r:.2f}:1, "
                f"needs ≥ {need}:1"
            )


def load_kiosk_config(path: str | Path | None, **overrides) -> KioskConfig:
    """The ``kiosk:`` section of the YAML server config at ``path`` (``None`` = defaults), then
    ``overrides`` (flags; ``None`` values are ignored). Other top-level sections are left to their owners.

    Raises:
        ValueError: unreadable YAML, a ``kiosk`` section that is not a mapping, an unknown key, a bad value.
    """
    values: dict = {}
    if path is not None:
        try:
            doc = yaml.safe_load(Path(path).read_text()) or {}
        except yaml.YAMLError as e:
            raise ValueError(f"{path}: not valid YAML ({e})") from e
        if not isinstance(doc, dict):
            raise ValueError(f"{path}: expected a mapping with a 'kiosk:' section")
        section = doc.get("kiosk") or {}
        if not isinstance(section, dict):
            raise ValueError(f"{path}: 'kiosk' must be a mapping")
        values = dict(section)
    cfg = _build(KioskConfig, values, "kiosk")
    given = {k: v for k, v in overrides.items() if v is not None}
    return replace(cfg, **given) if given else cfg


def page_config(cfg: KioskConfig) -> dict:
    """What the page needs (``GET /kiosk/config.json``): no system prompt or voice."""
    out = asdict(cfg)
    out.pop("system_prompt")
    out.pop("voice")
    return out


def kiosk_url(host: str, port: int) -> str:
    """The URL a browser on this machine opens (a wildcard bind address becomes loopback)."""
    shown = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host
    if ":" in shown:
        shown = f"[{shown}]"
    return f"http://{shown}:{port}/kiosk"


def is_loopback(host: str) -> bool:
    """Whether ``host`` names this machine (browsers allow the microphone there without https)."""
    return host in ("localhost", "127.0.0.1", "::1", "0.0.0.0", "::", "") or host.startswith("127.")


def chromium_command(url: str, browser: str = "chromium") -> list[str]:
    """The command line that opens ``url`` as an unattended full-screen kiosk: no click needed to play
    audio, the microphone allowed without a prompt, no crash or update bubbles, no swipe navigation.
    A non-loopback plain-http URL is marked as a secure origin (browsers only give the microphone to
    secure origins)."""
    cmd = [
        browser,
        "--kiosk",
        "--autoplay-policy=no-user-gesture-required",
        "--use-fake-ui-for-media-stream",
        "--noerrdialogs",
        "--disable-infobars",
        "--disable-session-crashed-bubble",
        "--no-first-run",
        "--overscroll-history-navigation=0",
        "--disable-pinch",
    ]
    host = re.sub(r"^https?://\[?([^/\]]+?)\]?(:\d+)?(/.*)?$", r"\1", url)
    if url.startswith("http://") and not is_loopback(host):
        origin = re.sub(r"^(https?://[^/]+).*$", r"\1", url)
        cmd.append(f"--unsafely-treat-insecure-origin-as-secure={origin}")
    return [*cmd, url]


def shell_line(cmd: list[str]) -> str:
    """``cmd`` as one line to paste into a shell."""
    return " ".join(shlex.quote(c) for c in cmd)
