"""Wire codecs shared by the server and the clients: the KServe V2 datatype table (``dtypes``)
and the binary TCP protocol's frame and metadata codecs (``tcp``).

The rule for this package: no sockets, no event loop, no engine. Modules here depend on the
standard library and numpy only, and import nothing from ``lumenrt.server``, ``lumenrt.engine``
or ``lumenrt.client`` (tests/unit/test_layering.py checks it), so that a client process loads
the codecs without the server, the engine or the native core.
"""
