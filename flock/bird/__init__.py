"""BIRD 2: the rendered configuration and the debounced reloader."""

from flock.bird.inputs import BirdInputs
from flock.bird.reloader import BirdReloader, ProcessRunner, ReloadError, run_process
from flock.bird.render import BgpTimers, RenderError, RenderSettings, render

__all__ = [
    "BgpTimers",
    "BirdInputs",
    "BirdReloader",
    "ProcessRunner",
    "ReloadError",
    "RenderError",
    "RenderSettings",
    "render",
    "run_process",
]
