"""`rollout-audit report`: one self-contained HTML page (inline SVG plots, no JavaScript, works offline)."""

from .page import render_html

__all__ = ["render_html"]
