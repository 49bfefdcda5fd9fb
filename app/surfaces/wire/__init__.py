"""Wire formats shared by surfaces (not a surface): the OpenAI Realtime events (:mod:`.realtime`: served by
the Realtime surface, spoken as a client by the LiveKit remote plugin) and G.711 (:mod:`.g711`: phone and
Realtime ``audio/pcmu|pcma``). Imports only the core's audio helpers."""
