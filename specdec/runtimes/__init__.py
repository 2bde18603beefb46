"""The built-in runtimes' declarations (specdec/runtime_registry.py's `Runtime`), one module per family: torch's
(torch_runtimes.py), llama.cpp's on GGUF files (gguf.py), ONNX Runtime's (onnx.py), OpenVINO's (openvino_ir.py) and
specbench's own kernels (kernels.py), each with its loader. The registry imports this package on its first lookup;
importing it imports every module beside it, and each registers its runtimes: a new runtime is a new module here.
"""
from __future__ import annotations

import importlib
import pkgutil

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")
