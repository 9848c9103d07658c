"""The front ends: KServe V2 over HTTP and gRPC and the binary TCP protocol, over one event loop.

``service`` is what every front end shares; ``app`` runs them; ``serve`` is ``lumenrt serve``. The
wire codecs they use (no I/O) are in ``lumenrt.protocols``; below them is ``lumenrt.engine``.
"""
