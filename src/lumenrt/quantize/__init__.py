"""INT8 quantization of ONNX models with ONNX Runtime's tools (``lumenrt quantize``).

The path of one run, one file each:
  model_source.py  the model (a file or ``builtin:NAME``): its inputs, opset, ops, config
  calibration.py   input samples (a folder of ``<input>.npy``, or ``builtin:NAME``), checked
                   against the model's inputs before anything big is read; the calibration reader
  quantizer.py     dynamic (MLP-like graphs) or static QDQ (convolutions), per-channel, pre-processed
  agreement.py     FP32 against INT8 on held-out samples: top-1 agreement, errors, accuracy
  timing.py        latency and throughput of both, in turns, with the same session settings
  report.py        the trade-off as a table and as JSON
  cli.py           the arguments and the run
"""
