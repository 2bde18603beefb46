import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402

# Tiny models run fastest on one thread, and tests must not fight each other for cores.
torch.set_num_threads(1)
