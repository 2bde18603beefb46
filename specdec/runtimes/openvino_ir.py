"""OpenVINO (specdec/backends/openvino.py): the model converted to an IR (specdec/models/convert_openvino.py; int8
weights by nncf, activations quantized per row at run time, attention one query row at a time) on OpenVINO's CPU
plugin, whose blocks are its steps bit for bit on its AVX-512 kernels, not on AVX2 (the calibration measured
block_vs_steps 3.5e-5 on an AVX2-only AMD EPYC, 2026-11-29; where a calibration measured it, its figure decides)."""
from specdec.backends.openvino import OPENVINO
from specdec.runtime_registry import CLOUD, Runtime, register

register(Runtime(
    "openvino-int8", "OpenVINO's CPU plugin, int8 weights (converted on first use)",
    loader="specdec.models.loading:load_converted", order=6, conversion="specdec.models.convert_openvino:load_openvino",
    options={"weights": "int8"},
    package=OPENVINO,
    timed_packages=("openvino", "nncf"), blocks_are_steps=True, exact_only_with="avx512f", weight_bits=8,
    auto=frozenset({CLOUD})))
