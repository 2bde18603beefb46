"""specbench's own kernels (specdec/kernels, specdec/backends/packed.py): the model's folder packed at load for the
instruction-set path this CPU has (AVX-512 VNNI, AVX-VNNI, AVX2 or NEON, one reference): int8 or int4 (groups of 32)
weights, int8 activations per row, exact int32 products, each attention row computed alone, so a block costs about one
step and its rows, a prefill's and batched sessions' are steps' logits bit for bit, the same bits on every processor."""
from specdec.runtime_registry import CLOUD, EDGE, Runtime, register

for order, bits in ((7, 8), (8, 4)):
    register(Runtime(
        f"kernels-int{bits}", f"specbench's own kernels, int{bits} weights (blocks cost about a step and are its steps "
        "bit for bit)", loader="specdec.models.loading:load_converted", order=order, aliases=(f"vnni-int{bits}",),
        conversion="specdec.models.pack_kernels:load_packed", options={"weights": f"int{bits}"},
        timed_packages=("torch", "transformers", "kernels"), needs_kernels=True, blocks_are_steps=True,
        weight_bits=bits, auto=frozenset({CLOUD, EDGE}), measured_first=True))
