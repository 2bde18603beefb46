"""Tiny random models built from configs (no downloads), and an edge/cloud pair that agrees
only partly: the edge is the cloud plus weight noise, so acceptance, rejection and bonus all run."""
from __future__ import annotations

import copy

import torch
from transformers import (
    Gemma3ForCausalLM,
    Gemma3TextConfig,
    LlamaConfig,
    LlamaForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
)

VOCAB = 96
COMMON = dict(
    vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, max_position_embeddings=512, bos_token_id=None, eos_token_id=None, pad_token_id=None,
)


def tiny_causal(arch: str = "llama", seed: int = 0, sharpness: float = 8.0):
    """A random causal LM whose output head is scaled by `sharpness` so its distributions are peaked
    like a trained model's (a near-uniform random head makes every draft a coin toss)."""
    torch.manual_seed(seed)
    if arch == "llama":
        model = LlamaForCausalLM(LlamaConfig(**COMMON))
    elif arch == "qwen2":
        model = Qwen2ForCausalLM(Qwen2Config(**COMMON))
    elif arch == "gemma3":
        # sliding_window 4 < the sequences used, so rollback must cross the window (activate_past_recording).
        cfg = Gemma3TextConfig(**COMMON, head_dim=16, sliding_window=4, layer_types=["sliding_attention", "full_attention"])
        model = Gemma3ForCausalLM(cfg)
    else:
        raise ValueError(arch)
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(sharpness)
    return model.eval()


def noisy_copy(model, noise: float, seed: int = 1):
    """The same model with Gaussian weight noise: a drafter that agrees with it only partly."""
    edge = copy.deepcopy(model)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in edge.parameters():
            p.add_(torch.randn(p.shape, generator=generator) * noise * p.std().clamp_min(1e-3))
    return edge.eval()


def random_prompt(seed: int, length: int | None = None) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    n = length or 4 + seed % 9
    return torch.randint(0, VOCAB, (n,), generator=generator)


def save_tiny_pair(root, noise: float = 0.2):
    """A cloud and a partly-agreeing edge saved as HF directories with a shared chat tokenizer."""
    from tests.omni_fixtures import tiny_omni_tokenizer

    tokenizer = tiny_omni_tokenizer()
    torch.manual_seed(0)
    cfg = LlamaConfig(**{**COMMON, "vocab_size": 64, "eos_token_id": tokenizer.eos_token_id})
    cloud = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        cloud.get_output_embeddings().weight.mul_(8.0)
    edge = noisy_copy(cloud, noise)
    paths = {}
    for role, model in (("edge", edge), ("cloud", cloud)):
        path = root / role
        model.save_pretrained(path)
        tokenizer.save_pretrained(path)
        paths[role] = str(path)
    return paths
