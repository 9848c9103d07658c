"""SqueezeNet 1.1 as an ONNX graph, built node by node with deterministic synthetic weights.

Architecture: Iandola et al., "SqueezeNet: AlexNet-level accuracy with 50x fewer parameters and
<0.5MB model size" (2016), version 1.1 as in torchvision's ``squeezenet1_1`` (3x3/64 stem with stride
2, max pools after the stem, fire3 and fire5, ceil-mode pooling). The weights are random: the model
is the seed's latency workload (1.2 M parameters, ~0.35 GFLOP per image), not a classifier.
Dropout is an identity at inference and is left out.
"""

from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import onnx
from onnx import TensorProto, helper, numpy_helper

INPUT_NAME = "data"
OUTPUT_NAME = "prob"
IMAGE_SHAPE = (3, 224, 224)
NUM_CLASSES = 1000
SEED = 0
EXAMPLE_SEED = 1  # the example images, which quantizing holds out to measure agreement on
CALIBRATION_SEED = 2  # what quantizing calibrates on: other images than the examples
OPSET = 17
IR_VERSION = 8  # the lowest IR that carries opset 17; readable by every onnxruntime since 1.11

# Squared norm of every conv filter. A zero-mean filter passes only the variance of its input, and a
# ReLU of a zero-mean Gaussian keeps (1/2 - 1/(2*pi)) = 0.341 of it, so 1 / 0.341 = 2.93 (derived)
# keeps the pre-activation variance constant through the depth; measured: activation RMS 1.2-1.4
# from conv1 to conv10 on standard-normal images.
GAIN = 2.93
# Extra scale of the classifier conv (guessed, then measured): logits get a spread of ~2 across the
# classes, so the softmax is peaked like a trained classifier's (top-1 ~0.1-0.2) rather than flat.
LOGIT_SCALE = 16.0

# (name, squeeze, expand1x1, expand3x3); "pool" marks a 3x3/2 ceil-mode max pool (torchvision 1.1).
_FIRE_PLAN: tuple[tuple[str, int, int, int] | str, ...] = (
    ("fire2", 16, 64, 64),
    ("fire3", 16, 64, 64),
    "pool",
    ("fire4", 32, 128, 128),
    ("fire5", 32, 128, 128),
    "pool",
    ("fire6", 48, 192, 192),
    ("fire7", 48, 192, 192),
    ("fire8", 64, 256, 256),
    ("fire9", 64, 256, 256),
)


class _GraphBuilder:
    """Collects nodes and initializers. Each conv filter is He-style: Gaussian, then made zero-mean
    (so the positive mean of ReLU outputs does not pile up into an input-independent common mode that
    decides every argmax) and scaled to squared norm GAIN (so all classes start equal and activations
    neither vanish nor explode). Biases are zero."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []

    def conv(
        self,
        name: str,
        x: str,
        c_in: int,
        c_out: int,
        kernel: int,
        stride: int = 1,
        pad: int = 0,
        scale: float = 1.0,
    ) -> str:
        weight = self.rng.standard_normal((c_out, c_in, kernel, kernel), dtype=np.float32)
        weight -= weight.mean(axis=(1, 2, 3), keepdims=True)
        weight *= np.float32(scale * np.sqrt(GAIN)) / np.sqrt((weight**2).sum(axis=(1, 2, 3), keepdims=True))
        bias = np.zeros((c_out,), dtype=np.float32)
        self.initializers.append(numpy_helper.from_array(weight, f"{name}.weight"))
        self.initializers.append(numpy_helper.from_array(bias, f"{name}.bias"))
        self.nodes.append(
            helper.make_node(
                "Conv",
                [x, f"{name}.weight", f"{name}.bias"],
                [f"{name}.out"],
                name=name,
                kernel_shape=[kernel, kernel],
                strides=[stride, stride],
                pads=[pad, pad, pad, pad],
            )
        )
        return f"{name}.out"

    def relu(self, x: str) -> str:
        out = f"{x}.relu"
        self.nodes.append(helper.make_node("Relu", [x], [out], name=out))
        return out

    def max_pool(self, name: str, x: str) -> str:
        self.nodes.append(
            helper.make_node(
                "MaxPool", [x], [name], name=name, kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1
            )
        )
        return name

    def fire(self, name: str, x: str, c_in: int, squeeze: int, expand1: int, expand3: int) -> tuple[str, int]:
        s = self.relu(self.conv(f"{name}.squeeze", x, c_in, squeeze, 1))
        e1 = self.relu(self.conv(f"{name}.expand1x1", s, squeeze, expand1, 1))
        e3 = self.relu(self.conv(f"{name}.expand3x3", s, squeeze, expand3, 3, pad=1))
        out = f"{name}.out"
        self.nodes.append(helper.make_node("Concat", [e1, e3], [out], name=out, axis=1))
        return out, expand1 + expand3


def build_squeezenet(seed: int = SEED) -> onnx.ModelProto:
    """SqueezeNet 1.1: ``data`` FP32 [N, 3, 224, 224] -> ``prob`` FP32 [N, 1000] (softmax)."""
    g = _GraphBuilder(seed)
    x = g.relu(g.conv("conv1", INPUT_NAME, IMAGE_SHAPE[0], 64, 3, stride=2))
    x = g.max_pool("pool1", x)
    channels = 64
    pools = 1
    for step in _FIRE_PLAN:
        if isinstance(step, str):
            pools += 1
            x = g.max_pool(f"pool{pools}", x)
        else:
            name, squeeze, expand1, expand3 = step
            x, channels = g.fire(name, x, channels, squeeze, expand1, expand3)
    x = g.relu(g.conv("conv10", x, channels, NUM_CLASSES, 1, scale=LOGIT_SCALE))
    g.nodes.append(helper.make_node("GlobalAveragePool", [x], ["pool10"], name="pool10"))
    g.nodes.append(helper.make_node("Flatten", ["pool10"], ["logits"], name="flatten", axis=1))
    g.nodes.append(helper.make_node("Softmax", ["logits"], [OUTPUT_NAME], name="softmax", axis=1))

    graph = helper.make_graph(
        g.nodes,
        "squeezenet1_1",
        [helper.make_tensor_value_info(INPUT_NAME, TensorProto.FLOAT, ["batch", *IMAGE_SHAPE])],
        [helper.make_tensor_value_info(OUTPUT_NAME, TensorProto.FLOAT, ["batch", NUM_CLASSES])],
        initializer=g.initializers,
    )
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", OPSET)],
        producer_name="lumenrt",
        ir_version=IR_VERSION,
        doc_string=f"SqueezeNet 1.1 with synthetic He-normal weights (numpy default_rng seed {seed})",
    )
    onnx.checker.check_model(model, full_check=True)
    return model


def write(model_dir: Path) -> dict[str, Any]:
    """Write ``1/model.onnx`` and return the model's config."""
    (model_dir / "1").mkdir(parents=True)
    onnx.save_model(build_squeezenet(SEED), str(model_dir / "1" / "model.onnx"))
    return {
        "backend": "onnxruntime",
        "max_batch_size": 8,
        "input": [{"name": INPUT_NAME, "datatype": "FP32", "dims": list(IMAGE_SHAPE)}],
        "output": [{"name": OUTPUT_NAME, "datatype": "FP32", "dims": [NUM_CLASSES]}],
        # No queue delay: on CPU a batch of n costs about n single images (287/s at batch 4 vs
        # 300/s at batch 1, 2 raw ONNX Runtime threads here), so waiting to fill a batch only adds
        # latency; batches still form from requests already queued (`benchmarks/serve.py`).
        "dynamic_batching": {"preferred_batch_size": [4, 8], "max_queue_delay_us": 0},
        "parameters": {"weights": {"kind": "synthetic", "rng": "numpy default_rng", "seed": SEED}},
    }


def example_images(batch: int, seed: int = EXAMPLE_SEED) -> npt.NDArray[np.float32]:
    """A deterministic batch of standard-normal "images" (the scale of a normalized photo); the
    first images of a seed are the same whatever the batch."""
    return np.random.default_rng(seed).standard_normal((batch, *IMAGE_SHAPE), dtype=np.float32)
