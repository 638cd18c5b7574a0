"""The console's themes: Textual themes (colours) and the Textual CSS (layout) they style.

``dark`` is the default, ``light`` suits bright terminals and ``high-contrast`` keeps every
foreground at full contrast with heavier borders. Colour is never the only carrier of
meaning: every state is also a word or a symbol, so NO_COLOR and monochrome terminals lose
nothing.
"""

from __future__ import annotations

from pathlib import Path

from textual.theme import Theme

HERE = Path(__file__).parent
CSS_PATHS: tuple[Path, ...] = (HERE / "console.tcss", HERE / "high-contrast.tcss")
"""Stylesheets, in order; the high-contrast one only matches under that theme's class."""

DARK = Theme(
    name="dark",
    primary="#4EA1FF",
    secondary="#7AA2F7",
    accent="#FFB454",
    warning="#E5C07B",
    error="#FF6B81",
    success="#9ECE6A",
    foreground="#D8DEE9",
    background="#0F1419",
    surface="#151B23",
    panel="#1E2630",
    dark=True,
)
LIGHT = Theme(
    name="light",
    primary="#0550AE",
    secondary="#6639BA",
    accent="#8A4600",
    warning="#9A6700",
    error="#CF222E",
    success="#1A7F37",
    foreground="#1F2328",
    background="#FFFFFF",
    surface="#F6F8FA",
    panel="#E6EAEF",
    dark=False,
)
HIGH_CONTRAST = Theme(
    name="high-contrast",
    primary="#00FFFF",
    secondary="#FFFF00",
    accent="#FFFF00",
    warning="#FFD700",
    error="#FF4040",
    success="#00FF00",
    foreground="#FFFFFF",
    background="#000000",
    surface="#000000",
    panel="#000000",
    dark=True,
    text_alpha=1.0,
)

THEMES: dict[str, Theme] = {t.name: t for t in (DARK, LIGHT, HIGH_CONTRAST)}
DEFAULT = "dark"

__all__ = ["CSS_PATHS", "DEFAULT", "THEMES"]
