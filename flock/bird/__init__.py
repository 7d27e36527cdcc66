"""BIRD 2: the rendered configuration and the debounced reloader."""

from flock.bird.inputs import BirdInputs
from flock.bird.reloader import BirdReloader, ProcessRunner, ReloadError, run_process
from flock.bird.render import (
    SECRETS_FILE,
    BgpTimers,
    RenderError,
    RenderSettings,
    ServiceRoutes,
    render,
    render_secrets,
)

__all__ = [
    "SECRETS_FILE",
    "BgpTimers",
    "BirdInputs",
    "BirdReloader",
    "ProcessRunner",
    "ReloadError",
    "RenderError",
    "RenderSettings",
    "ServiceRoutes",
    "render",
    "render_secrets",
    "run_process",
]
