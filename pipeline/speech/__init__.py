"""The TTS families' engine wrappers: add / step / abort over our engine, streaming decoders, synthesize."""
