"""Ray itself: imported on first use (the ``distributed`` extra), started or joined by :func:`init`."""

from __future__ import annotations

import os

from ..errors import MissingDependencyError, OptionError


def import_ray():
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")  # nothing is sent anywhere
    try:
        import ray
        import ray.data
    except ImportError as exc:
        raise MissingDependencyError(
            "Ray extraction needs Ray Data: pip install 'layerwise[distributed]'"
        ) from exc
    return ray


def init(mode: str = "local", *, workers: int = 2, threads_per_worker: int = 1) -> None:
    """Start or join Ray: ``local`` starts one on this machine (loopback, no dashboard);
    ``auto`` joins the running cluster (``ray start`` / RAY_ADDRESS). No-op when Ray is up."""
    ray = import_ray()
    if ray.is_initialized():
        return
    if mode == "local":
        ray.init(
            num_cpus=workers * threads_per_worker,
            include_dashboard=False,
            log_to_driver=False,
            configure_logging=False,
        )
    elif mode == "auto":
        ray.init(address="auto", log_to_driver=False, configure_logging=False)
    else:
        raise OptionError(f"--ray {mode!r}: use 'local' (start Ray here) or 'auto' (join a running cluster)")
