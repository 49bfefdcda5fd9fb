"""The browser voice chat (and the kiosk page's media): WebRTC, Opus 48 kHz, events on a data channel."""
