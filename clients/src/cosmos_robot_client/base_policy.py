"""The policy interface every component speaks: ``infer(obs) -> dict`` and ``reset()``.

It lives in the smallest package (the robot-side client) so that servers, simulators and trainers
all build on it without pulling torch. Two optional capabilities are declared here too, because the
server needs to discover them without knowing the policy's family:

- ``infer_batch(list_of_obs) -> list_of_results``: the server groups requests from many connections
  into one call when a policy has it (see ``BatchPolicy``);
- ``metadata`` and ``input_spec``: what the server announces on connect and validates each request
  against before it reaches the model, so a bad request fails with a message naming the key.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from typing import Any

from cosmos_robot_client.spec import InputSpec

__all__ = ["BasePolicy", "BatchPolicy", "supports_batch"]


class BasePolicy(abc.ABC):
    """A policy maps one observation dict to an action dict (``{"actions": (H, D) array, ...}``)."""

    @abc.abstractmethod
    def infer(self, obs: dict[str, Any]) -> dict[str, Any]:
        """Return the action dict for one observation."""

    def reset(self) -> None:  # noqa: B027 - optional hook, a no-op by default like openpi's
        """Called at an episode boundary; stateless policies need not override it."""

    @property
    def metadata(self) -> dict[str, Any]:
        """Facts a client may need (``action_horizon``, action space, expected keys); msgpack-able."""
        return {}

    @property
    def input_spec(self) -> InputSpec | None:
        """The observation keys, shapes and dtypes this policy accepts; ``None`` accepts anything."""
        return None

    def example_observation(self) -> dict[str, Any] | None:
        """One valid observation for warming the policy up before serving (compilation, CUDA graph
        capture), or ``None`` when it cannot make one. By default the input spec's zero-filled
        example, if the spec accepts it; families whose keys are aliases override this."""
        spec = self.input_spec
        if spec is None:
            return None
        obs = spec.example()
        try:
            spec.validate(obs)
        except ValueError:
            return None
        return obs

    @property
    def cheap_inference(self) -> bool:
        """True only if ``infer`` takes microseconds and never blocks (scripted or constant policies).

        A server may then call it on its event loop instead of a worker thread. Models must leave
        this False: a slow call on the loop would stall every connection.
        """
        return False


class BatchPolicy(BasePolicy):
    """A policy that can answer many observations in one call (one forward pass on a GPU).

    Subclasses implement ``infer_batch``; ``infer`` is derived from it. Observations in one call
    always share keys, shapes and dtypes (the server groups them that way), so implementations may
    stack them directly.
    """

    @abc.abstractmethod
    def infer_batch(self, obs_batch: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
        """Return one action dict per observation, in order."""

    def infer(self, obs: dict[str, Any]) -> dict[str, Any]:
        return self.infer_batch([obs])[0]


def supports_batch(policy: BasePolicy) -> bool:
    """True when the policy has a usable ``infer_batch`` (subclass or duck-typed)."""
    return callable(getattr(policy, "infer_batch", None))
