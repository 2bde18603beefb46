"""A CJK-capable font for the figures and the page. Matplotlib's bundled DejaVu Sans has no Chinese
glyphs, and a fresh machine usually has no system CJK font, so labels and sample text in the main
prompt set (`zh-describe`) drew as empty boxes, in PNGs and in a browser's screenshot of the page.
Noto Sans SC (SIL OFL 1.1) comes from a pinned PyPI package (pyproject.toml) and is checked against
its sha256 before use. Figures: registered with matplotlib at runtime as a fallback after DejaVu
Sans, so Latin text looks as before and CJK glyphs come from Noto (matplotlib >= 3.6 falls back per
glyph). Page: a subset holding only the characters the page uses (KBs, not the 8 MB font) is
embedded in the page's CSS."""
from __future__ import annotations

import base64
import functools
import hashlib
import io
from importlib import resources
from pathlib import Path

import matplotlib
from fontTools import subset
from matplotlib import font_manager

from specdec.errors import ConfigError

PACKAGE, FILE = "pylopdf_fonts_zh_cn", "NotoSansSC-Regular.otf"  # pylopdf-fonts-zh-cn==0.1.1
SHA256 = "faa6c9df652116dde789d351359f3d7e5d2285a2b2a1f04a2d7244df706d5ea9"
FAMILY = "Noto Sans SC"
CSS_FAMILY = "specbench Noto Sans SC"  # the page's name for the subset (never a system font's name)
FIX = "reinstall it: pip install --force-reinstall 'pylopdf-fonts-zh-cn==0.1.1'"


def cjk_font_path() -> Path:
    """The checked font file; ConfigError naming the fix when it is missing or not the pinned one."""
    try:
        path = Path(str(resources.files(PACKAGE) / FILE))
    except ModuleNotFoundError:
        raise ConfigError(f"the CJK font package is not installed: {FIX}") from None
    if not path.is_file():
        raise ConfigError(f"the CJK font {FILE} is missing from {path.parent}: {FIX}")
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    if digest != SHA256:
        raise ConfigError(f"the CJK font {path} has sha256 {digest[:12]}..., not the pinned {SHA256[:12]}...: {FIX}")
    return path


def subplots(*args, **kwargs):
    """`plt.subplots`, after the CJK font is registered: every figure of the report and of `compare` is made here, so
    the font is needed when a figure is drawn, not when a module is imported (a server or a fleet on a machine
    without the font package imports the CLI, which imports the report's modules)."""
    import matplotlib.pyplot as plt

    use_cjk_font()
    return plt.subplots(*args, **kwargs)


@functools.cache
def use_cjk_font() -> str:
    """Register the checked font once per process and make it matplotlib's sans-serif fallback."""
    font_manager.fontManager.addfont(str(cjk_font_path()))
    # Fallback is per glyph across the families of font.family (a generic name resolves to one font).
    latin = next(f for f in matplotlib.rcParams["font.sans-serif"] if f != FAMILY)
    matplotlib.rcParams["font.family"] = [latin, FAMILY]
    return FAMILY


def _needs_cjk_font(char: str) -> bool:
    """CJK ideographs, kana, hangul, CJK and fullwidth punctuation: U+2E80 and above, outside the
    private-use and surrogate blocks."""
    return ord(char) >= 0x2E80 and not 0xD800 <= ord(char) <= 0xF8FF


def font_face_css(page_text: str) -> str:
    """An @font-face rule for the characters of `page_text` that need a CJK font, subset from the
    checked Noto Sans SC and embedded as a data: URI (Chromium refuses a web font linked from a
    file:// page, and the report must open from a folder); "" when the page has none."""
    chars = "".join(sorted({c for c in page_text if _needs_cjk_font(c)}))
    if not chars:
        return ""
    options = subset.Options()
    options.flavor = "woff"  # zlib-compressed; every browser reads it
    font = subset.load_font(str(cjk_font_path()), options)
    subsetter = subset.Subsetter(options)
    subsetter.populate(text=chars)
    subsetter.subset(font)
    data = io.BytesIO()
    subset.save_font(font, data, options)
    src = "data:font/woff;base64," + base64.b64encode(data.getvalue()).decode("ascii")
    return f'@font-face {{ font-family: "{CSS_FAMILY}"; src: url("{src}") format("woff"); }}'
