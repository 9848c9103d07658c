"""lumenrt: a low-latency inference server with a small native core.

The native core (lock-free rings, arenas, futex waits, shared memory) is in ``lumenrt.native``.
"""

__version__ = "0.1.0"
