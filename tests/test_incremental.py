"""Incremental stepping with rollback equals a full recompute (a cache rolled back inconsistently with
the accepted tokens drifts and loops)."""
import pytest
import torch

from specdec.backends.hf_causal import HFCausalBackend
from specdec.backends.prompt import Prompt
from tests.tiny import VOCAB, random_prompt, tiny_causal


@pytest.mark.parametrize("arch", ["llama", "qwen2", "gemma3"])
def test_blocks_and_rollback_match_full_forward(arch):
    model = tiny_causal(arch)
    backend = HFCausalBackend(model)
    prompt_ids = random_prompt(3, length=7)
    continuation = torch.randint(0, VOCAB, (14,), generator=torch.Generator().manual_seed(5))
    detour = torch.randint(0, VOCAB, (5,), generator=torch.Generator().manual_seed(6))

    with torch.inference_mode():
        state, prefill_logits = backend.prefill(Prompt(prompt_ids), prompt_ids, keep=3)
        # A rejected draft: feed 5 detour tokens, then roll them back (crossing gemma3's window of 4).
        backend.forward(state, detour[:2])
        backend.forward(state, detour[2:])
        backend.crop(state, prompt_ids.numel())
        stepped = [backend.forward(state, continuation[:1])]
        stepped.append(backend.forward(state, continuation[1:6]))  # a block
        backend.crop(state, prompt_ids.numel() + 4)  # partial rollback inside the block
        stepped = [stepped[0], stepped[1][:3]]
        for token in continuation[4:]:
            stepped.append(backend.forward(state, token.view(1)))  # token by token
        full = model(torch.cat([prompt_ids, continuation]).unsqueeze(0)).logits[0].float()

    assert state.length == prompt_ids.numel() + continuation.numel()
    n_prompt = prompt_ids.numel()
    torch.testing.assert_close(prefill_logits, full[n_prompt - 3 : n_prompt], atol=1e-5, rtol=0)
    torch.testing.assert_close(torch.cat(stepped), full[n_prompt:], atol=1e-5, rtol=0)


def test_crop_beyond_state_is_refused():
    backend = HFCausalBackend(tiny_causal("llama"))
    ids = random_prompt(0, length=5)
    with torch.inference_mode():
        state, _ = backend.prefill(Prompt(ids), ids)
    with pytest.raises(ValueError, match="cannot crop a state of length 5 to 6"):
        backend.crop(state, 6)


def test_forward_keep_returns_the_last_rows_only():
    """`keep` limits the output head to the last positions; the rows equal the full block's."""
    model = tiny_causal("llama")
    backend = HFCausalBackend(model)
    ids = random_prompt(3, length=9)
    with torch.inference_mode():
        full_state, _ = backend.prefill(Prompt(ids[:5]), ids[:5])
        full = backend.forward(full_state, ids[5:])
        kept_state, _ = backend.prefill(Prompt(ids[:5]), ids[:5])
        kept = backend.forward(kept_state, ids[5:], keep=2)
    assert full.shape[0] == 4 and kept.shape[0] == 2
    torch.testing.assert_close(kept, full[-2:], atol=1e-5, rtol=1e-5)
    assert kept_state.length == full_state.length == 9
