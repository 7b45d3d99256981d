"""Shared test setup: offline hub, headless GL, and a helper to run a policy server in a thread."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("MUJOCO_GL", "egl")
os.environ.setdefault("PYOPENGL_PLATFORM", "egl")
# One intra-op thread per process: on a 2-core box torch's default of 2 collapses when envs,
# servers and other tests run beside it (measured 2-4x slower); set before torch is imported.
os.environ.setdefault("OMP_NUM_THREADS", "1")
