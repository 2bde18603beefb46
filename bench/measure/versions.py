"""What a runtime's timings depend on besides the machine: the installed versions of the packages it runs on, and
for specbench's own kernels the path this CPU runs and its sources' digest. The calibration keeps them with each
entry (an entry of other versions is stale) and `runtime_costs` with each row (a rerun times anew what other
versions timed)."""
from __future__ import annotations

from importlib import metadata

from specdec.kernels import KernelError, chosen_path, source_digest

# The distributions of the packages a runtime's timings depend on (its declaration's timed_packages).
DISTRIBUTIONS = {"torch": "torch", "transformers": "transformers", "llama_cpp": "llama_cpp_python",
                 "onnxruntime": "onnxruntime", "onnxruntime_genai": "onnxruntime-genai", "openvino": "openvino",
                 "nncf": "nncf"}


def runtime_versions() -> dict[str, str | None]:
    """The installed versions of what the runtimes run on (None: not installed), read without importing them."""
    found: dict[str, str | None] = {}
    for package, distribution in DISTRIBUTIONS.items():
        try:
            found[package] = metadata.version(distribution)
        except metadata.PackageNotFoundError:
            found[package] = None
    try:  # our own kernels: the path this CPU runs and its source are their version
        found["kernels"] = f"{chosen_path()} {source_digest()}"
    except KernelError:
        found["kernels"] = None  # no path here: like a package not installed
    return found
