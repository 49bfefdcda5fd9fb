"""Relay benchmark (issue 4): shared-memory slots vs pickle over ZMQ vs multiprocessing.Queue.

Thin wrapper so the benchmark can be run from a checkout:
``python benchmarks/bench_relay.py [--quick] [--json out.json]``. The implementation and the
definition of every number are in :mod:`omniduplex.relay.bench`.
"""

from omniduplex.relay.bench import main

if __name__ == "__main__":
    main()
