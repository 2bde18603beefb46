"""A tiny edge/cloud pair built in-process from fixed seeds: the quick benchmark and the gate's
`tiny` workload. It lives in `bench/` (not `tests/`) because the gate's committed baseline hashes
its outputs: the pair must not change when a test fixture does, and `specbench gate` must build
it from an installed package.

The cloud is a random 2-layer Llama whose output head is scaled so its distributions are peaked
like a trained model's; the edge is the cloud plus Gaussian weight noise, so it agrees only partly
(acceptance, corrections and bonus tokens all occur). Both share a word-level ChatML tokenizer.
"""
from __future__ import annotations

import copy
from pathlib import Path

import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

WORDS = (
    "<unk> <|endoftext|> system user assistant you are a helpful write explain the code function list "
    "string number sort return value if else for in of to and is hello world yes no one two three four "
    "five six seven eight nine ten . , ? ( ) :"
).split()
SPECIALS = ["<|im_start|>", "<|im_end|>"]
VOCAB = 64  # model rows > tokenizer ids, as in real models
CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
PROMPTS = (
    "write a function to sort a list of number",
    "explain the code : for one in list return value",
    "hello world , is the string a number ?",
    "write the function if value is no else yes",
)
SEED = 0
HEAD_SHARPNESS = 8.0  # output head scale: near-uniform random heads make every draft a coin toss
EDGE_NOISE = 0.2  # weight noise of the edge, relative to each tensor's std


def tokenizer() -> PreTrainedTokenizerFast:
    core = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    core.add_special_tokens(SPECIALS)
    tok = PreTrainedTokenizerFast(tokenizer_object=core, unk_token="<unk>", eos_token="<|im_end|>",
                                  pad_token="<|endoftext|>")
    tok.chat_template = CHATML
    assert len(tok) <= VOCAB
    return tok


def build_pair(edge_noise: float = EDGE_NOISE, seed: int = SEED) -> tuple[LlamaForCausalLM, LlamaForCausalLM]:
    """(edge, cloud), fp32, deterministic for a given torch version."""
    eos = tokenizer().eos_token_id
    config = LlamaConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=512, bos_token_id=None, eos_token_id=eos, pad_token_id=eos,
    )
    torch.manual_seed(seed)
    cloud = LlamaForCausalLM(config).eval()
    edge = copy.deepcopy(cloud)
    generator = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        cloud.get_output_embeddings().weight.mul_(HEAD_SHARPNESS)
        edge.get_output_embeddings().weight.mul_(HEAD_SHARPNESS)
        for p in edge.parameters():
            p.add_(torch.randn(p.shape, generator=generator) * edge_noise * p.std().clamp_min(1e-3))
    return edge.eval(), cloud


def save_pair(root: str | Path, edge_noise: float = EDGE_NOISE, seed: int = SEED) -> dict[str, str]:
    """Save the pair as HF directories `root/edge` and `root/cloud`; returns {role: path}."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # a bar per tiny shard is noise
    tok = tokenizer()
    paths = {}
    for role, model in zip(("edge", "cloud"), build_pair(edge_noise, seed)):
        path = Path(root) / role
        model.save_pretrained(path)
        tok.save_pretrained(path)
        paths[role] = str(path)
    return paths
