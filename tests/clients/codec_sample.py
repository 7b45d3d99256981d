"""The observation ``test_codec`` packs with our codec and with the real openpi-client's.

Plain numpy on purpose: .venv-openpi (numpy<2, no cosmos-robot) imports this module too, so both
sides pack the very same values.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def sample_obs() -> dict[str, Any]:
    """An image, a float64 vector, a string, numpy scalars and a big-endian array."""
    return {
        "observation/image": np.arange(224 * 224 * 3, dtype=np.uint32).astype(np.uint8).reshape(224, 224, 3),
        "observation/state": np.arange(8, dtype=np.float64),
        "prompt": "pick",
        "flag": np.True_,
        "scalar": np.float32(0.5),
        "be": np.arange(3, dtype=">i2"),
    }
