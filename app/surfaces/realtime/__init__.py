"""The OpenAI Realtime API (GA) surface: ``/v1/realtime`` connections bridged to a ``Session``."""
