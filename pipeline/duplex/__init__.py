"""Full-duplex serving: every live session of a Moshi-architecture model advances one 80 ms frame per tick,
all sessions in one batched step (:mod:`.engine`)."""
