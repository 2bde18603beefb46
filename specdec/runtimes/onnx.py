"""ONNX Runtime (specdec/backends/onnxrt.py): the model's folder converted once by onnxruntime-genai's builder
(specdec/models/convert_onnx.py; int4 or int8 weights, int8 activations), a one-token step padded to two rows so
steps are blocks' rows bit for bit."""
from specdec.backends.onnxrt import ONNX
from specdec.runtime_registry import CLOUD, EDGE, Runtime, register

for order, bits, roles in ((4, 4, frozenset({CLOUD, EDGE})), (5, 8, frozenset({CLOUD}))):
    register(Runtime(
        f"onnx-int{bits}", f"ONNX Runtime, int{bits} weights (converted on first use)",
        loader="specdec.models.loading:load_converted", order=order,
        conversion="specdec.models.convert_onnx:load_onnx", options={"variant": f"int{bits}"}, package=ONNX,
        timed_packages=("onnxruntime", "onnxruntime_genai"), blocks_are_steps=True, weight_bits=bits, auto=roles))
