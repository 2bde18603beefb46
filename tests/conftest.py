import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import json  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

from tests.tiny import save_tiny_pair  # noqa: E402

# Tiny models run fastest on one thread, and tests must not fight each other for cores.
torch.set_num_threads(1)


# The tiny edge/cloud pair saved as HF folders, and three short prompts: one copy per test module
# (a module may damage its copy on purpose), shared by the modules that do not define their own.
@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    return save_tiny_pair(tmp_path_factory.mktemp("models"))


@pytest.fixture(scope="module")
def prompts(tmp_path_factory):
    path = tmp_path_factory.mktemp("prompts") / "p.jsonl"
    path.write_text("".join(json.dumps({"id": f"p{i}", "prompt": t}) + "\n"
                            for i, t in enumerate(["hello world", "one two three", "say yes"])))
    return str(path)
