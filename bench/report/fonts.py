"""A CJK-capable font for the figures. Matplotlib's bundled DejaVu Sans has no Chinese glyphs, and
a fresh machine usually has no system CJK font, so labels and sample text in the main prompt set
(`zh-describe`) drew as empty boxes. Noto Sans SC (SIL OFL 1.1) comes from a pinned PyPI package
(pyproject.toml), is checked against its sha256 before use, and is registered with matplotlib at
runtime as a fallback after DejaVu Sans: Latin text looks as before, CJK glyphs come from Noto
(matplotlib >= 3.6 falls back per glyph)."""
from __future__ import annotations

import functools
import hashlib
from importlib import resources
from pathlib import Path

import matplotlib
from matplotlib import font_manager

from specdec.errors import ConfigError

PACKAGE, FILE = "pylopdf_fonts_zh_cn", "NotoSansSC-Regular.otf"  # pylopdf-fonts-zh-cn==0.1.1
SHA256 = "faa6c9df652116dde789d351359f3d7e5d2285a2b2a1f04a2d7244df706d5ea9"
FAMILY = "Noto Sans SC"
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


@functools.cache
def use_cjk_font() -> str:
    """Register the checked font once per process and make it matplotlib's sans-serif fallback."""
    font_manager.fontManager.addfont(str(cjk_font_path()))
    # Fallback is per glyph across the families of font.family (a generic name resolves to one font).
    latin = next(f for f in matplotlib.rcParams["font.sans-serif"] if f != FAMILY)
    matplotlib.rcParams["font.family"] = [latin, FAMILY]
    return FAMILY
