"""The batched-env API every backend shares: masks, per-env seeds/options, episode bookkeeping, failures.

Why a base class of our own rather than gymnasium's ``VectorEnv``: the evaluator and the RL trainer
need per-env reset options (a task name per env), a partial reset that leaves the other envs running,
and a worker failure that truncates one episode instead of raising for the whole batch. Gymnasium 1.x
vector envs share one ``options`` dict across envs and raise on a worker error, so the semantics live
here once and each backend (in-process, subprocess, Ray) only implements :meth:`BatchedEnv._run`:
"run these commands on these envs, with this timeout, and tell me what each returned or why it
could not". The autoreset convention is documented in the package docstring.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
from gymnasium import spaces
from gymnasium.vector import AutoresetMode
from gymnasium.vector.utils import batch_space

from cosmos_robot_envs.vector.runner import ENV_ERROR, EnvFn, EnvReply, Failure, Outcome
from cosmos_robot_envs.vector.spaces import ActionLayout, ObsLayout

__all__ = ["RESET_FAILURE", "BatchObs", "BatchedEnv", "ResetCmd", "StepCmd", "env_fn_list"]

# info key of a reset that succeeded only on its retry: {"reason", "error"} of the first attempt
RESET_FAILURE = "reset_failure"

BatchObs = Any  # dict[str, np.ndarray | list[str]] for Dict spaces, else np.ndarray (or list[str] for Text)
Seeds = int | Sequence[int | None] | None
Options = Mapping[str, Any] | Sequence[Mapping[str, Any] | None] | None


@dataclass(frozen=True)
class ResetCmd:
    seed: int | None
    options: dict[str, Any] | None


@dataclass(frozen=True)
class StepCmd:
    action: np.ndarray


Command = ResetCmd | StepCmd


class BatchedEnv(ABC):
    """``num_envs`` copies of one env behind ``reset(seeds, options, mask)`` and ``step(actions, mask)``."""

    metadata: ClassVar[dict[str, Any]] = {"autoreset_mode": AutoresetMode.DISABLED}

    def __init__(
        self,
        num_envs: int,
        observation_space: spaces.Space[Any],
        action_space: spaces.Space[Any],
        *,
        step_timeout: float | None,
        reset_timeout: float | None,
    ) -> None:
        self.num_envs = num_envs
        self.single_observation_space = observation_space
        self.single_action_space = action_space
        self.observation_space = batch_space(observation_space, num_envs)
        self.action_space = batch_space(action_space, num_envs)
        self.obs_layout = ObsLayout.from_space(observation_space)
        self.action_layout = ActionLayout.from_space(action_space)
        self.step_timeout = step_timeout
        self.reset_timeout = reset_timeout
        # the (num_envs, ...) array per observation key that replies are written into: in-process
        # buffers, unless a backend puts views of shared memory in their place
        self._arrays: dict[str, np.ndarray] = {
            k: np.zeros((num_envs, *f.shape), dtype=f.dtype) for k, f in self.obs_layout.arrays.items()
        }
        self._blocked: list[str | None] = ["it was never reset"] * num_envs
        self._texts: dict[str, list[str]] = {k: [""] * num_envs for k in self.obs_layout.texts}
        self._last_obs: BatchObs | None = None
        self._closed = False

    # -- what a backend provides -------------------------------------------------------------------
    @abstractmethod
    def _run(self, commands: dict[int, Command], timeout: float | None) -> dict[int, Outcome]:
        """Run each command on its env concurrently; a failed worker must already be replaced."""

    @abstractmethod
    def _close(self) -> None: ...

    # -- public API --------------------------------------------------------------------------------
    @property
    def needs_reset(self) -> np.ndarray:
        """Per env: True until it is reset (never reset, episode ended, or its worker failed)."""
        return np.array([b is not None for b in self._blocked])

    def reset(
        self, seeds: Seeds = None, options: Options = None, mask: Sequence[bool] | np.ndarray | None = None
    ) -> tuple[BatchObs, list[dict[str, Any]]]:
        """Reset the envs selected by ``mask`` (all when None); the others keep their episode.

        ``seeds``: an int (env i gets ``seed + i``), or one entry per env (length ``num_envs``) or per
        selected env (length ``mask.sum()``). ``options``: one dict for all selected envs, or one per env
        / per selected env, like ``seeds``. Returns the whole batch (rows of envs not reset are their
        latest observation) and one info dict per env (empty for envs not reset).
        """
        self._check_open()
        idx = self._indices(mask)
        seed_list = self._per_env(seeds, idx, "seeds")
        opt_list = self._per_env(options, idx, "options")
        commands: dict[int, Command] = {}
        for i, seed, opt in zip(idx, seed_list, opt_list, strict=True):
            if seed is not None and not isinstance(seed, (int, np.integer)):
                raise TypeError(f"seeds: env {i} got {type(seed).__name__}, expected int or None")
            if opt is not None and not isinstance(opt, Mapping):
                raise TypeError(f"options: env {i} got {type(opt).__name__}, expected a dict or None")
            commands[i] = ResetCmd(None if seed is None else int(seed), None if opt is None else dict(opt))
        outcomes = self._run(commands, self.reset_timeout) if commands else {}
        # a crash or hang during reset gets one more try on the fresh worker; an env error would repeat
        retry = {i: commands[i] for i, o in outcomes.items() if isinstance(o, Failure) and o.reason != ENV_ERROR}
        first_failures = {i: outcomes[i] for i in retry}
        if retry:
            outcomes.update(self._run(retry, self.reset_timeout))
        infos: list[dict[str, Any]] = [{} for _ in range(self.num_envs)]
        for i, outcome in outcomes.items():
            if isinstance(outcome, EnvReply):
                self._write_row(i, outcome)
                self._blocked[i] = None
                infos[i] = outcome.info
                failed = first_failures.get(i)
                if isinstance(failed, Failure):  # the retry worked: say what it cost, never hide it
                    infos[i] = {**outcome.info, RESET_FAILURE: {"reason": failed.reason, "error": failed.message}}
            else:
                self._restore_row(i)
                self._blocked[i] = f"its last reset failed ({outcome.reason})"
                infos[i] = _failure_info(outcome)
        return self._publish(), infos

    def step(
        self, actions: Any, mask: Sequence[bool] | np.ndarray | None = None
    ) -> tuple[BatchObs, np.ndarray, np.ndarray, np.ndarray, list[dict[str, Any]]]:
        """Step the envs selected by ``mask`` (all when None) with their row of ``actions``.

        ``actions`` has shape ``(num_envs, *single_action_space.shape)``; rows of envs left out are
        ignored, and those envs return their latest observation, reward 0 and both flags False.
        """
        self._check_open()
        idx = self._indices(mask)
        blocked = [f"env {i}: {self._blocked[i]}" for i in idx if self._blocked[i] is not None]
        if blocked:
            raise RuntimeError(
                "cannot step envs that need a reset (" + "; ".join(blocked) + "); reset them with "
                "reset(mask=...) or leave them out with step(actions, mask=...)"
            )
        acts = self.action_layout.check_batch(actions, self.num_envs)
        outcomes = self._run({i: StepCmd(acts[i]) for i in idx}, self.step_timeout) if idx else {}
        rewards = np.zeros(self.num_envs, dtype=np.float64)
        terminated = np.zeros(self.num_envs, dtype=bool)
        truncated = np.zeros(self.num_envs, dtype=bool)
        infos: list[dict[str, Any]] = [{} for _ in range(self.num_envs)]
        for i, outcome in outcomes.items():
            if isinstance(outcome, EnvReply):
                self._write_row(i, outcome)
                rewards[i], terminated[i], truncated[i] = outcome.reward, outcome.terminated, outcome.truncated
                infos[i] = outcome.info
                if outcome.terminated or outcome.truncated:
                    how = "terminated" if outcome.terminated else "truncated"
                    self._blocked[i] = f"its episode ended ({how})"
            else:
                self._restore_row(i)
                truncated[i] = True
                infos[i] = _failure_info(outcome)
                self._blocked[i] = f"its worker failed ({outcome.reason})"
        return self._publish(), rewards, terminated, truncated, infos

    def close(self) -> None:
        """Stop every worker; safe to call twice."""
        if not self._closed:
            self._closed = True
            self._close()

    def __enter__(self) -> BatchedEnv:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- helpers -----------------------------------------------------------------------------------
    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("this vector env is closed")

    def _indices(self, mask: Sequence[bool] | np.ndarray | None) -> list[int]:
        if mask is None:
            return list(range(self.num_envs))
        arr = np.asarray(mask)
        if arr.dtype != bool or arr.shape != (self.num_envs,):
            raise ValueError(f"mask must be a bool array of shape ({self.num_envs},), got {arr.dtype} {arr.shape}")
        return [int(i) for i in np.flatnonzero(arr)]

    def _per_env(self, value: Any, idx: list[int], name: str) -> list[Any]:
        if value is None:
            return [None] * len(idx)
        if name == "seeds" and isinstance(value, (int, np.integer)):
            return [int(value) + i for i in idx]
        if name == "options" and isinstance(value, Mapping):
            return [value] * len(idx)
        values = list(value)
        if len(values) == self.num_envs:
            return [values[i] for i in idx]
        if len(values) == len(idx):
            return values
        raise ValueError(
            f"{name} has {len(values)} entries; expected num_envs={self.num_envs} or one per selected env ({len(idx)})"
        )

    def _write_row(self, i: int, reply: EnvReply) -> None:
        arrays = self._arrays
        for key, value in reply.arrays.items():
            np.copyto(arrays[key][i], value, casting="same_kind")
        for key, text in reply.texts.items():
            self._texts[key][i] = text

    def _restore_row(self, i: int) -> None:
        """A failed env keeps its previous observation (zeros / "" if it never had one)."""
        arrays = self._arrays
        last = self._last_obs
        for key, arr in arrays.items():
            arr[i] = 0 if last is None else (last[key] if self.obs_layout.is_dict else last)[i]
        for key in self.obs_layout.texts:
            self._texts[key][i] = "" if last is None else (last[key] if self.obs_layout.is_dict else last)[i]

    def _publish(self) -> BatchObs:
        """Copy the batch out of the (possibly shared) buffers so the next step cannot change it."""
        arrays = self._arrays
        if not self.obs_layout.is_dict:
            obs: BatchObs = arrays[""].copy() if arrays else list(self._texts[""])
        else:
            obs = {}
            for key in self.single_observation_space.keys():  # type: ignore[attr-defined]
                obs[key] = arrays[key].copy() if key in arrays else list(self._texts[key])
        self._last_obs = obs
        return obs


def env_fn_list(env_fns: Sequence[EnvFn]) -> list[EnvFn]:
    """A backend's env factories as a list; none at all is refused."""
    if not env_fns:
        raise ValueError("env_fns is empty; pass at least one env factory")
    return list(env_fns)


def _failure_info(failure: Failure) -> dict[str, Any]:
    return {"truncated_reason": failure.reason, "worker_error": failure.message}
