"""OpenAI Realtime API (GA) compatibility: wire protocol, audio formats, and the bridge to a ``Session``."""
