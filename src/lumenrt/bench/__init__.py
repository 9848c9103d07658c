"""The measuring tools shipped with lumenrt: ``lumenrt bench load`` (the load generator,
``load_*.py``) and ``lumenrt bench matrix`` (``matrix.py``), with what they share: result files
(:mod:`lumenrt.bench.results`), a ``lumenrt serve`` child process (``serve_process.py``) and the raw
ONNX Runtime limit (``engine_load.py``). None of them judges the numbers.

The other benchmarks (queues, engine, stages, serve) are scripts in a checkout's ``benchmarks/``,
not part of the package; they import these modules.
"""
