"""``layerwise serve``: every layer over HTTP, OpenAI-compatible, dynamically batched.

    from layerwise.serve import create_app, ServeSettings
    app = create_app({"all-MiniLM-L6-v2": lw.Encoder()}, ServeSettings(api_key=...))
    # run with any ASGI server, e.g. uvicorn.run(app, host="127.0.0.1", port=8000)

Needs the ``serve`` extra (FastAPI, uvicorn, prometheus-client): pip install 'layerwise[serve]'.
"""

try:
    import fastapi  # noqa: F401
    import prometheus_client  # noqa: F401
except ImportError as exc:
    from ..errors import MissingDependencyError

    raise MissingDependencyError(
        f"the service needs {exc.name}: pip install 'layerwise[serve]' (FastAPI, uvicorn, prometheus-client)"
    ) from exc

from .._settings.serve import API_KEY_ENV, ServeSettings, read_api_key
from ._app import create_app
from ._responses import ApiError

__all__ = ["API_KEY_ENV", "ApiError", "ServeSettings", "create_app", "read_api_key"]
