"""Serving benchmark: lumenrt serve vs Triton (perf_analyzer on SqueezeNet, HTTP and gRPC,
concurrency 1-8) and digits_mlp round trips vs a loopback TCP echo.

Same as ``lumenrt bench serve``; run ``python benchmarks/serve.py --help``.
"""

import sys

from lumenrt.bench.serve_bench import main

if __name__ == "__main__":
    sys.exit(main())
