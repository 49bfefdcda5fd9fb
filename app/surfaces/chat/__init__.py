"""OpenAI-compatible text chat: ``POST /v1/chat/completions`` (:mod:`.routes`)."""
