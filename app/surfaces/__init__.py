"""The surfaces: each is its wire codec and signalling over the core's session, exposing routes (or a worker)
over the host. A surface never imports another (``tests/test_layout.py``); wire formats that more than one
surface, or a surface and its client, speak live in :mod:`.wire`."""
