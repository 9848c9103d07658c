"""Queue benchmark: native rings vs queue.Queue, multiprocessing.Queue, faster-fifo, pyzmq.

Same as ``lumenrt bench queues``; run ``python benchmarks/queues.py --help``.
"""

import sys

from lumenrt.bench.queues import main

if __name__ == "__main__":
    sys.exit(main())
