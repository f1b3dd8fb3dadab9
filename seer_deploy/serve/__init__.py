"""The OpenAI-compatible HTTP server: the app factory, its batching queue, running it, and (ray_app, optional)
a Ray Serve deployment of the same app. It sits above the generation service and calls nothing else to run."""

from seer_deploy.serve.app import create_app
from seer_deploy.serve.options import ServeOptions
from seer_deploy.serve.server import BackgroundServer

__all__ = ["BackgroundServer", "ServeOptions", "create_app"]
