"""Wire codecs shared by the front ends and the clients, free of I/O: the KServe V2 datatype table
(``dtypes``), the one raw tensor codec (``raw``), tensor checks and V2 JSON data (``tensors``),
request parameters (``parameters``), the HTTP headers that change a request's meaning
(``http_headers``), the binary TCP protocol's frames and metadata (``tcp``), the gRPC messages
(``proto``) and the error a request is answered with (``errors``).

The rule for this package: no sockets, no event loop, no engine. Modules here depend on the
standard library, numpy (and, for ``proto``, protobuf) only, and import nothing from lumenrt outside
``lumenrt.protocols`` (tests/unit/test_layering.py checks it), so that a client process loads the
codecs without the front ends, the engine or the native core.
"""
