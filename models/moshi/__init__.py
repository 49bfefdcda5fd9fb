"""Moshi (Kyutai, arXiv 2410.00037): a full-duplex speech-text foundation model.

Mimi (:mod:`.mimi`) turns 24 kHz audio into 8 codebooks at 12.5 Hz (one 80 ms frame = 1920 samples) and back;
the Moshi LM (:mod:`.lm`) models text + model audio + user audio streams with a temporal transformer over
frames and a depth transformer over a frame's codebooks (:mod:`.transformer`). Tensor names follow the
``moshi`` package's published safetensors; :mod:`.checkpoint` writes and reads random presets.
"""
