"""The OpenAI Realtime API (GA) wire protocol: client and server events as typed models, parsing, audio
formats."""
