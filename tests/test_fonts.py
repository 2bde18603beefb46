"""Chinese text in figures draws as glyphs: the pinned Noto Sans SC is checked and registered, a
Chinese label renders without matplotlib's missing-glyph warning, and no character renders as the
missing-glyph box (.notdef)."""
import warnings

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from bench.report import fonts  # noqa: E402
from specdec.errors import ConfigError  # noqa: E402

LABEL = "说话人语速平缓，情绪稳定。"  # a zh-describe style output
NOTDEF = "\ue000"  # a private-use code point no font here has: what a missing glyph looks like


def render(text: str) -> np.ndarray:
    fig = plt.figure(figsize=(0.8, 0.8), dpi=60)
    fig.text(0.5, 0.5, text, fontsize=28, ha="center", va="center")
    fig.canvas.draw()
    pixels = np.asarray(fig.canvas.buffer_rgba())[..., 0].copy()
    plt.close(fig)
    return pixels


def test_a_chinese_label_renders_as_glyphs_not_boxes(tmp_path):
    assert fonts.use_cjk_font() == "Noto Sans SC"
    box = render(NOTDEF)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # "Glyph ... missing from font(s)" would raise here
        glyphs = {char: render(char) for char in dict.fromkeys(LABEL)}
        fig, ax = plt.subplots()
        ax.set_title(LABEL)
        ax.set_xlabel("speed-up vs cloud-only (×)")
        fig.savefig(tmp_path / "label.png")
        plt.close(fig)
    for char, pixels in glyphs.items():
        assert (pixels < 128).any(), f"{char!r} drew nothing"
        assert not np.array_equal(pixels, box), f"{char!r} drew the missing-glyph box"
    distinct = {pixels.tobytes() for pixels in glyphs.values()}
    assert len(distinct) == len(glyphs)  # every character its own glyph, not one shared box


def test_the_font_file_is_the_pinned_one(monkeypatch):
    assert fonts.cjk_font_path().name == "NotoSansSC-Regular.otf"
    monkeypatch.setattr(fonts, "SHA256", "0" * 64)
    with pytest.raises(ConfigError, match="not the pinned .*pip install --force-reinstall"):
        fonts.cjk_font_path()
