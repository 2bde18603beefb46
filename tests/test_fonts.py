"""Chinese text in figures draws as glyphs: the pinned Noto Sans SC is checked and registered, a
Chinese label renders without matplotlib's missing-glyph warning, and no character renders as the
missing-glyph box (.notdef)."""
import json
import re
import subprocess
import sys
import warnings
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import numpy as np
import pytest

from bench.read.report import fonts
from specdec.errors import ConfigError
from tests.test_report import run_chromium

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
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # this one is meant to be missing
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


# Python run in a child process where the font package cannot be imported (a GPU machine's environment has none).
WITHOUT_FONT = """
import sys
class NoFont:
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] == 'pylopdf_fonts_zh_cn':
            raise ModuleNotFoundError(f"No module named {name!r}")
sys.meta_path.insert(0, NoFont())
"""


@pytest.mark.subprocess
def test_the_cli_imports_without_the_font_and_a_figure_names_the_fix():
    """The font is needed when a figure is drawn, not when a module is imported: `serve` and `fleet` import the CLI,
    which imports the report's modules, on machines that have no font package (the GPU check's)."""
    code = WITHOUT_FONT + """
import bench.cli
from bench.read.report import fonts
from specdec.errors import ConfigError
try:
    fonts.subplots()
except ConfigError as e:
    print("refused:", e)
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          cwd=Path(__file__).parent.parent)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == ("refused: the CJK font package is not installed: "
                                   "reinstall it: pip install --force-reinstall 'pylopdf-fonts-zh-cn==0.1.1'")


def test_every_figure_is_made_after_the_font_is_registered():
    """No report module calls matplotlib's subplots itself: fonts.subplots registers the font first."""
    root = Path(__file__).parent.parent / "bench"
    direct = [str(f) for f in root.rglob("*.py")
              if f.name != "fonts.py" and "plt.subplots(" in f.read_text(encoding="utf-8")]
    assert direct == []


# --- the page, in a browser -------------------------------------------------------------------
GLYPH_CHECK = """<script>
document.fonts.load('32px "%(family)s"', '%(label)s').then(faces => {
  const canvas = document.createElement("canvas"); canvas.width = 48; canvas.height = 48;
  const g = canvas.getContext("2d");
  const draw = ch => { g.clearRect(0, 0, 48, 48); g.font = '32px "%(family)s", monospace'; g.fillText(ch, 4, 36);
                       return Array.from(g.getImageData(0, 0, 48, 48).data).join(","); };
  const box = draw("\\ue000"), glyphs = Array.from('%(label)s', draw);
  const out = document.createElement("pre"); out.id = "glyph-check";
  out.textContent = JSON.stringify({faces: faces.length, boxes: glyphs.filter(p => p === box).length,
                                    distinct: new Set(glyphs).size, chars: glyphs.length});
  document.body.appendChild(out);
});
</script>"""


def test_the_page_draws_chinese_in_a_browser_without_cjk_fonts(chromium, tmp_path):
    """The @font-face the report embeds covers its Chinese text: in headless Chromium (which has no
    CJK font here) every character draws its own glyph, none the missing-glyph box."""
    label = "说话人语速平缓情绪稳定"
    css = fonts.font_face_css(f"<p>{label}</p>")
    assert css.startswith("@font-face") and "data:font/woff;base64," in css
    assert fonts.font_face_css("<p>only latin, and 1.50×</p>") == ""
    check = GLYPH_CHECK % {"family": fonts.CSS_FAMILY, "label": label}
    page = tmp_path / "page.html"
    page.write_text(f'<!DOCTYPE html><meta charset="utf-8"><style>{css}</style><p>{label}</p>{check}', encoding="utf-8")
    done = run_chromium(chromium, tmp_path / "chrome", "--virtual-time-budget=10000", "--dump-dom", page.as_uri())
    found = re.search(r'<pre id="glyph-check">(.*?)</pre>', done.stdout, re.S)
    assert found, f"chromium printed no glyph check: {done.stderr[-1500:]}"
    result = json.loads(found.group(1))
    assert result == {"faces": 1, "boxes": 0, "distinct": len(label), "chars": len(label)}, result
