"""BIRD 2: the rendered configuration and the debounced reloader."""

from flock.bird.render import BgpTimers, RenderError, RenderSettings, render

__all__ = ["BgpTimers", "RenderError", "RenderSettings", "render"]
