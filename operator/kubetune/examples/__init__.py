"""Toy trainables: tiny, fast functions for examples, demos, tests and benchmarks.

- ``quadratic:train``  a quadratic bowl in ``x``, ``y``; reports ``val_loss``.
- ``flaky:train``      checkpoints every iteration and fails once, mid-way.
- ``sleepy:train``     reports slowly (or when told to), prints, checkpoints on demand.
- ``misbehaving``      functions that exit, report text, or are not functions (troubleshooting).
"""
