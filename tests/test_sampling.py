"""Speculative sampling is lossless in distribution; temperature is applied exactly once."""
import pytest
import torch
from scipy.stats import chisquare

from specdec import DecodeConfig, Prompt, SpecConfig, speculative_decode
from specdec.backends.hf_causal import HFCausalBackend
from specdec.core.drafters import DraftContext
from specdec.core.drafters.model import ModelDrafter
from specdec.core.policies.sample import speculative_sample
from specdec.core.processors import Constraints
from specdec.core.sampling import distribution, entropy_nats
from specdec.core.session import AcceptedSequence
from tests.tiny import noisy_copy, random_prompt, tiny_causal

V = 6
CLOUD = torch.tensor([0.05, 0.40, 0.10, 0.25, 0.15, 0.05])


@pytest.mark.parametrize(
    "edge_probs",
    [
        torch.tensor([0.50, 0.05, 0.05, 0.10, 0.10, 0.20]),  # disagrees strongly
        torch.full((V,), 1 / V),  # uniform drafter
        CLOUD.clone(),  # a perfect drafter
    ],
)
def test_first_emitted_token_follows_the_cloud_distribution(edge_probs):
    """Whatever the drafter, the token that leaves position 0 (accepted draft or resample) ~ CLOUD."""
    generator = torch.Generator().manual_seed(1234)
    trials = 20000
    counts = torch.zeros(V)
    cloud_probs = CLOUD.expand(3, V)
    draft_probs = edge_probs.expand(2, V)
    for _ in range(trials):
        draft_tokens = torch.multinomial(draft_probs, 1, generator=generator).squeeze(-1)
        accepted, next_token = speculative_sample(draft_tokens, draft_probs, cloud_probs.log(), cloud_probs, True, generator)
        first = draft_tokens[0] if accepted > 0 else next_token
        counts[int(first)] += 1
    result = chisquare(counts.numpy(), (CLOUD * trials).numpy())
    assert result.pvalue > 0.001, (counts / trials, result)


def test_second_position_and_bonus_follow_the_cloud_distribution():
    """Given acceptance of d_0, the next emitted token (d_1 or its resample) ~ cloud row 1; the bonus
    after a full acceptance ~ cloud row n."""
    generator = torch.Generator().manual_seed(7)
    row1 = torch.tensor([0.30, 0.10, 0.10, 0.10, 0.30, 0.10])
    cloud_probs = torch.stack([CLOUD, row1, CLOUD])
    draft_probs = torch.full((2, V), 1 / V)
    counts = torch.zeros(V)
    trials = 30000
    for _ in range(trials):
        draft_tokens = torch.multinomial(draft_probs, 1, generator=generator).squeeze(-1)
        accepted, next_token = speculative_sample(draft_tokens, draft_probs, cloud_probs.log(), cloud_probs, True, generator)
        if accepted >= 1:
            second = draft_tokens[1] if accepted == 2 else next_token
            counts[int(second)] += 1
    assert chisquare(counts.numpy(), (row1 * counts.sum()).numpy()).pvalue > 0.001


def test_end_to_end_sampling_matches_cloud_next_token_distribution():
    """Through the whole engine: the first new token of `sample` spec decoding ~ softmax(cloud/T)."""
    cloud = tiny_causal("llama", sharpness=2.0)
    edge = noisy_copy(cloud, noise=0.5)
    ids = random_prompt(11)
    temperature = 0.8
    with torch.inference_mode():
        expected = torch.softmax(cloud(ids.unsqueeze(0)).logits[0, -1] / temperature, -1)
    counts = torch.zeros_like(expected)
    trials = 1500
    spec = SpecConfig(k=3, entropy_threshold=0, policy="sample")
    edge_backend, cloud_backend = HFCausalBackend(edge), HFCausalBackend(cloud)
    for seed in range(trials):
        generation = speculative_decode(
            edge_backend, cloud_backend, Prompt(ids), spec, DecodeConfig(max_new_tokens=1, temperature=temperature, seed=seed)
        )
        counts[generation.tokens[0]] += 1
    keep = expected * trials >= 5  # chi-square needs expected counts >= 5: pool the tail
    observed, wanted = counts[keep].double(), expected[keep].double() * trials
    if not keep.all():
        observed = torch.cat([observed, counts[~keep].sum().view(1)])
        wanted = torch.cat([wanted, expected[~keep].sum().view(1) * trials])
    wanted *= observed.sum() / wanted.sum()  # float32 softmax sums to 1 only up to rounding
    assert chisquare(observed.numpy(), wanted.numpy()).pvalue > 0.001


def test_temperature_is_applied_once_after_processors():
    """The draft distribution is softmax((logits + processor shift) / T): not / T twice (which over-sharpens)."""
    model = tiny_causal("llama", sharpness=2.0)
    ids = random_prompt(2)
    shift = torch.zeros(96)
    shift[7] = 3.0

    def boost_seven(generated, logits):
        return logits + shift

    temperature = 0.7
    with torch.inference_mode():
        raw = model(ids.unsqueeze(0)).logits[0, -1]
        seq = AcceptedSequence(ids, 4)
        context = DraftContext(Prompt(ids), 96, Constraints(processors=(boost_seven,)), temperature,
                               torch.Generator().manual_seed(0), edge=HFCausalBackend(model))
        draft_probs = ModelDrafter(context).propose(seq, 1).probs
    torch.testing.assert_close(draft_probs[0], torch.softmax((raw + shift) / temperature, -1), atol=1e-6, rtol=1e-5)
    assert not torch.allclose(draft_probs[0], torch.softmax((raw + shift) / temperature**2, -1), atol=1e-3)


def test_entropy_is_in_nats():
    assert float(entropy_nats(torch.full((4,), 0.25))) == pytest.approx(torch.log(torch.tensor(4.0)).item())
    assert float(entropy_nats(torch.tensor([1.0, 0.0, 0.0]))) == 0.0
    assert float(entropy_nats(distribution(torch.zeros(8), 0.0))) == pytest.approx(2.0794415, abs=1e-6)
