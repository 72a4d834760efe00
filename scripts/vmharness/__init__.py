"""QEMU harness: boots a real multi-NUMA Linux guest whose root is the host's root
(a throw-away writable overlay) and runs one command in it. Tooling, not the agent.

    from vmharness import run_in_guest
    result = run_in_guest("2node", [".venv/bin/python", "-m", "pytest", "-q", "tests/e2e"], timeout=900)
"""

from .boot import GuestBootError, GuestError, GuestResult, run_in_guest
from .build import GuestImage, SetupError, ensure_guest_image
from .shapes import SHAPES, Shape, ShapeError, get_shape

__all__ = ["GuestBootError", "GuestError", "GuestImage", "GuestResult", "SHAPES", "SetupError",
           "Shape", "ShapeError", "ensure_guest_image", "get_shape", "run_in_guest"]
