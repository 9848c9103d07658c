"""Engine benchmark: the engine against raw ONNX Runtime sessions (throughput, batch-1 overhead,
queue_type x allocator_type table).

Same as ``lumenrt bench engine``; run ``python benchmarks/engine.py --help``.
"""

import sys

from lumenrt.bench.engine_bench import main

if __name__ == "__main__":
    sys.exit(main())
