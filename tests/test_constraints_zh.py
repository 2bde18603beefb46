"""The `zh` profile (one short Chinese sentence, no comma storms or short loops) on real Chinese
strings, with a tiny offline tokenizer whose tokens are single characters, short words and
punctuation."""
from __future__ import annotations

import pytest
import torch
from tokenizers import Tokenizer, models
from transformers import PreTrainedTokenizerFast

from specdec.core.constraints_zh import (
    CommaGate,
    ContentRepetitionPenalty,
    ContentTrigramBan,
    EarlyPeriodPenalty,
    NoImmediateRepeat,
    SuppressEarlyEos,
    ZhParams,
    ZhTokenTable,
    zh_profile,
)
from specdec.core.text import PUNCT_DENSITY_ABNORMAL, PUNCT_DENSITY_HEALTHY, cjk_content, is_cjk, punctuation_density
from specdec.errors import ConfigError

CHARS = "说话人的音色中声语速平缓情绪稳定真想字逗好呀嗯很清晰低沉温和是一位男女性年轻有点激动快慢"
WORDS = ["音色", "真想", "说话人", "语速", "情绪", "平缓", "稳定", "中性", "的，", "。\n"]
PUNCT = list("，。、：:,.!?！？；")
OTHER = [" ", "\ufffd音", "ok"]  # whitespace, a partial byte-level piece, a Latin token
SPECIALS = ["[UNK]", "</s>"]
VOCAB = SPECIALS + list(CHARS) + WORDS + PUNCT + OTHER
V = len(VOCAB) + 4  # model heads are often padded past the tokenizer
ID = {t: i for i, t in enumerate(VOCAB)}
EOS = ID["</s>"]
NEG_INF = float("-inf")


class CountingTokenizer(PreTrainedTokenizerFast):
    """Counts every decode (batch_decode goes through decode)."""

    decode_calls = 0

    def decode(self, *args, **kwargs):
        type(self).decode_calls += 1
        return super().decode(*args, **kwargs)


def make_tokenizer(cls=PreTrainedTokenizerFast) -> PreTrainedTokenizerFast:
    model = models.WordLevel({t: i for i, t in enumerate(VOCAB)}, unk_token="[UNK]")
    return cls(tokenizer_object=Tokenizer(model), unk_token="[UNK]", eos_token="</s>")


def tok(text: str) -> list[int]:
    """Greedy longest match over VOCAB: "说话人的音色中" -> [说话人, 的, 音色, 中]."""
    out, i = [], 0
    longest = max(map(len, VOCAB))
    while i < len(text):
        for n in range(min(longest, len(text) - i), 0, -1):
            if text[i : i + n] in ID:
                out.append(ID[text[i : i + n]])
                i += n
                break
        else:
            raise KeyError(text[i])
    return out


@pytest.fixture(scope="module")
def profile():
    return zh_profile(make_tokenizer(), [EOS], V)


def proc(profile, cls):
    (found,) = [p for p in profile.processors if isinstance(p, cls)]
    return found


def run(processor, text: str, logits: torch.Tensor | None = None) -> torch.Tensor:
    logits = torch.zeros(V) if logits is None else logits
    before = logits.clone()
    out = processor(tok(text), logits)
    assert torch.equal(logits, before), "processors must not modify logits in place"
    return out


def banned(out: torch.Tensor) -> set[str]:
    return {VOCAB[i] for i in range(len(VOCAB)) if out[i] == NEG_INF}


def test_tokenizer_round_trip():
    assert [VOCAB[i] for i in tok("说话人的音色中，")] == ["说话人", "的", "音色", "中", "，"]


# Rule 1: no immediately repeated CJK character.
def test_immediate_repeat_bans_tokens_starting_with_last_char(profile):
    assert banned(run(proc(profile, NoImmediateRepeat), "说话人的音色中")) == {"中", "中性"}
    assert banned(run(proc(profile, NoImmediateRepeat), "真想真")) == {"真", "真想"}


def test_immediate_repeat_skips_whitespace(profile):
    assert banned(run(proc(profile, NoImmediateRepeat), "真想真 ")) == {"真", "真想"}


def test_immediate_repeat_silent_after_punctuation(profile):
    assert banned(run(proc(profile, NoImmediateRepeat), "说话人的音色中，")) == set()
    assert banned(run(proc(profile, NoImmediateRepeat), "")) == set()


# Rule 2: trigram ban over the punctuation-stripped content history.
def test_trigram_ban_fires_on_the_seed_loop(profile):
    # content 音色中音色中: (色, 中) was followed by 音, so 音… would repeat 色中音.
    assert banned(run(proc(profile, ContentTrigramBan), "音色中，音色中，")) == {"音", "音色"}
    # "真想 真想": (真, 想) was followed by 真.
    assert banned(run(proc(profile, ContentTrigramBan), "真想 真想")) == {"真", "真想"}


def test_trigram_ban_silent_without_a_repeated_pair(profile):
    assert banned(run(proc(profile, ContentTrigramBan), "音色中，声音")) == set()
    assert banned(run(proc(profile, ContentTrigramBan), "真想")) == set()


def test_trigram_ban_breaks_a_greedy_loop(profile):
    """A "model" that always wants 音色 中 ， in a cycle cannot close "音色中，音色中，音色中"."""
    cycle = [ID["音色"], ID["中"], ID["，"]]
    ban = proc(profile, ContentTrigramBan)
    generated: list[int] = []
    for step in range(9):
        logits = torch.zeros(V)
        logits[cycle[step % 3]] = 10.0
        generated.append(int(ban(generated, logits).argmax()))
    text = "".join(VOCAB[i] for i in generated)
    assert "音色中，音色中，音色中" not in text
    content = cjk_content(text)
    trigrams = [content[i : i + 3] for i in range(len(content) - 2)]
    assert len(trigrams) == len(set(trigrams))


# Rule 3: comma-like marks only after >= 4 content chars since the last punctuation.
COMMAS = {"，", "、", "：", ":", ","}


def test_comma_gate_fires_after_two_chars(profile):
    # "字字逗": 好的，说话 has 2 chars since the last mark.
    assert banned(run(proc(profile, CommaGate), "好的，说话")) == COMMAS | {"的，"}
    assert banned(run(proc(profile, CommaGate), "说话")) == COMMAS | {"的，"}


def test_comma_gate_counts_chars_inside_the_candidate_token(profile):
    # 3 chars since the start: "，" would be the 4th position, "的，" brings its own 的.
    assert banned(run(proc(profile, CommaGate), "说话人")) == COMMAS


def test_comma_gate_open_after_four_chars(profile):
    assert banned(run(proc(profile, CommaGate), "好的，说话人的")) == set()
    assert banned(run(proc(profile, CommaGate), "说话人语速平缓")) == set()


# Rule 4: `。` penalised by 8 logits before 8 content chars in the sentence.
def test_period_penalised_at_five_chars(profile):
    out = run(proc(profile, EarlyPeriodPenalty), "说话人的音", torch.full((V,), 3.0))
    assert out[ID["。"]] == pytest.approx(-5.0) and out[ID["。\n"]] == pytest.approx(-5.0)
    assert out[ID["！"]] == 3.0 and out[ID["音"]] == 3.0
    # a sentence end restarts the count; a comma does not
    after_end = run(proc(profile, EarlyPeriodPenalty), "说话人的音色很清晰。好", torch.full((V,), 3.0))
    assert after_end[ID["。"]] == pytest.approx(-5.0)


def test_period_free_at_nine_chars(profile):
    out = run(proc(profile, EarlyPeriodPenalty), "说话人的音色很清晰", torch.full((V,), 3.0))
    assert torch.equal(out, torch.full((V,), 3.0))
    with_comma = run(proc(profile, EarlyPeriodPenalty), "说话人的音色，很清晰", torch.full((V,), 3.0))
    assert with_comma[ID["。"]] == 3.0


# Rule 5: repetition penalty 1.22 on generated CJK content tokens only.
def test_repetition_penalty_hits_seen_content_tokens(profile):
    logits = torch.full((V,), 2.0)
    logits[ID["的"]] = -2.0
    out = run(proc(profile, ContentRepetitionPenalty), "说话人的音色，音色", logits)
    assert out[ID["音色"]] == pytest.approx(2.0 / 1.22)
    assert out[ID["说话人"]] == pytest.approx(2.0 / 1.22)
    assert out[ID["的"]] == pytest.approx(-2.0 * 1.22)


def test_repetition_penalty_spares_punctuation_and_unseen_tokens(profile):
    logits = torch.full((V,), 2.0)
    out = run(proc(profile, ContentRepetitionPenalty), "说话人的音色，音色", logits)
    for untouched in ["，", "声", "音", "的，", "。"]:
        assert out[ID[untouched]] == 2.0
    assert torch.equal(run(proc(profile, ContentRepetitionPenalty), "，。、", logits), logits)


# Rule 6: one sentence, at least 16 tokens; EOS suppressed before that.
def test_stop_rule_stops_at_sentence_end_after_min_tokens(profile):
    stop = profile.stop
    assert stop.min_new_tokens == 16
    assert {VOCAB[i] for i in stop.sentence_end_ids} == {"。", "。\n", ".", "!", "?", "！", "？"}
    assert stop.stops(ID["。"], 16) and stop.stops(ID["！"], 20)
    assert stop.stops(EOS, 3)  # EOS always ends generation; it is kept away by the logits


def test_stop_rule_keeps_going_before_min_tokens(profile):
    assert not profile.stop.stops(ID["。"], 10)
    assert not profile.stop.stops(ID["，"], 30)


def test_eos_suppressed_before_min_tokens(profile):
    suppress = proc(profile, SuppressEarlyEos)
    ten = tok("说话人的音色很清晰，声音低沉温和")[:10]
    assert suppress(ten[:10], torch.zeros(V))[EOS] == NEG_INF
    assert suppress([ID["的"]] * 14, torch.zeros(V))[EOS] == NEG_INF  # EOS would be token 15
    assert suppress([ID["的"]] * 15, torch.zeros(V))[EOS] == 0.0  # EOS would be token 16
    assert banned(suppress(ten[:10], torch.zeros(V))) == {"</s>"}


# Token classes and the decode-once contract.
def test_token_table_classes():
    table = ZhTokenTable.build(make_tokenizer(), V, ZhParams())
    assert table.content[ID["\ufffd音"]] == ""  # partial UTF-8 counts as non-CJK
    assert not table.is_content_token[ID["\ufffd音"]]
    assert table.is_content_token[ID["说话人"]] and not table.is_content_token[ID["的，"]]
    assert not table.is_content_token[ID[" "]] and not table.is_content_token[ID["ok"]]
    assert table.content[V - 1] == "" and table.last_char[V - 1] == ""  # padded ids beyond the tokenizer


def test_params_are_the_seed_numbers_and_validated():
    assert ZhParams() == ZhParams(4, 8, -8.0, 1.22, 16)
    with pytest.raises(ConfigError):
        ZhParams(repetition_penalty=0.0)


def test_profile_never_decodes_while_processing():
    tokenizer = make_tokenizer(CountingTokenizer)
    CountingTokenizer.decode_calls = 0
    profile = zh_profile(tokenizer, [EOS], V)
    built = CountingTokenizer.decode_calls
    assert built >= 1
    generated = tok("说话人的音色中")
    for _ in range(20):
        generated.append(int(profile.apply(generated, torch.randn(V)).argmax()))
    assert CountingTokenizer.decode_calls == built


def test_full_profile_on_a_comma_happy_model():
    """A "model" that prefers a comma at every step writes no "字字逗" and no early EOS."""
    profile = zh_profile(make_tokenizer(), [EOS], V)
    torch.manual_seed(0)
    base = torch.randn(V)
    base[len(VOCAB) :] = NEG_INF  # padded ids
    base[ID["，"]] = base[EOS] = 20.0
    generated: list[int] = []
    while len(generated) < 40:
        token = int(profile.apply(generated, base).argmax())
        generated.append(token)
        if profile.stop.stops(token, len(generated)):
            break
    text = "".join(VOCAB[i] for i in generated)
    assert len(generated) >= 16 and generated[-1] == EOS
    for clause in text.replace("</s>", "").split("，")[:-1]:
        assert len(cjk_content(clause)) >= 4
    assert not any(a == b and is_cjk(a) for a, b in zip(text, text[1:]))
    content = cjk_content(text)
    trigrams = [content[i : i + 3] for i in range(len(content) - 2)]
    assert len(trigrams) == len(set(trigrams))


# Text helpers for the harness.
def test_punctuation_density_healthy_sentence():
    lo, hi = PUNCT_DENSITY_HEALTHY
    assert lo <= punctuation_density("说话人语速平缓，情绪稳定。") <= hi


def test_punctuation_density_comma_flood():
    assert punctuation_density("好，的，呀，嗯，") > PUNCT_DENSITY_ABNORMAL
    assert punctuation_density("好 ，") == 0.5  # whitespace is not a character here
    assert punctuation_density("") == 0.0 and punctuation_density("说话人") == 0.0


def test_is_cjk():
    assert all(is_cjk(ch) for ch in "说话人音色")
    assert not any(is_cjk(ch) for ch in "，。、：a1 \ufffd")
    assert cjk_content("音色中，音色中。") == "音色中音色中"
