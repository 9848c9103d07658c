"""GPU instances (``instance_group: [{kind: KIND_GPU}]``): the device seam and what runs on it.

  device.py        the ``Device`` protocol (pinned host buffers, device buffers, streams, events,
                   asynchronous copies, graph capture) and the ``DeviceProgram`` a backend loads
  devices.py       ``open_device``, the one place that picks an implementation
  torch_device.py  ``TorchCudaDevice``: the protocol over ``torch.cuda`` (imported only by
                   ``open_device``, when a GPU instance loads)
  staging.py       per instance, two sets of pinned host and device buffers sized for
                   max_batch_size, allocated once at load
  pipeline.py      the stream schedule: copy in, compute and copy out of consecutive batches overlap
  serving.py       a GPU instance's worker loop: batches gathered straight into the staging
                   buffers, two batches in flight, every request answered once
  stats.py         device times and memory, for the statistics and the metrics

Nothing here imports torch, CUDA or NVML at import time: a CPU-only install never loads them
(tests/unit/test_gpu_imports.py).
"""
