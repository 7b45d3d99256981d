"""In-process backend: the envs run one after another in the caller's process.

Why keep it: it is the reference the other backends are tested against (same seeds, same
trajectories), it has no start-up cost for tests and debugging, and a debugger or profiler sees the
env code directly. It cannot survive a segfault or detect a hang (there is no other process to
watch), so ``step_timeout`` / ``reset_timeout`` are ignored here; an exception raised by an env is
reported like in the other backends and the env is rebuilt from its factory before its next reset.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence

from cosmos_robot_envs.vector.base import BatchedEnv, Command, ResetCmd, env_fn_list
from cosmos_robot_envs.vector.runner import ENV_ERROR, EnvFn, EnvRunner, Failure, Outcome, describe_exception

__all__ = ["SyncBatchedEnv"]


class SyncBatchedEnv(BatchedEnv):
    """All envs in this process; see :class:`BatchedEnv` for the API."""

    def __init__(
        self, env_fns: Sequence[EnvFn], *, step_timeout: float | None = None, reset_timeout: float | None = None
    ) -> None:
        self._env_fns = env_fn_list(env_fns)
        self._runners: list[EnvRunner | None] = []
        try:
            for i, fn in enumerate(self._env_fns):
                self._runners.append(EnvRunner(fn, i))
            first = self._runners[0]
            assert first is not None
            for i, runner in enumerate(self._runners):
                assert runner is not None
                for name in ("observation_space", "action_space"):
                    if getattr(runner.env, name) != getattr(first.env, name):
                        raise ValueError(f"env {i} has a different {name} than env 0; all envs must match")
            super().__init__(
                len(env_fns),
                first.env.observation_space,
                first.env.action_space,
                step_timeout=step_timeout,
                reset_timeout=reset_timeout,
            )
        except BaseException:
            self._close()
            raise

    @property
    def envs(self) -> list[EnvRunner | None]:
        """The runners (``runner.env`` is the gymnasium env); None while an env awaits its rebuild."""
        return self._runners

    def _run(self, commands: dict[int, Command], timeout: float | None) -> dict[int, Outcome]:
        outcomes: dict[int, Outcome] = {}
        for i, cmd in commands.items():
            try:
                runner = self._runners[i]
                if runner is None:
                    runner = self._runners[i] = EnvRunner(self._env_fns[i], i)
                if isinstance(cmd, ResetCmd):
                    outcomes[i] = runner.reset(cmd.seed, cmd.options)
                else:
                    outcomes[i] = runner.step(cmd.action)
            except Exception as exc:  # noqa: BLE001 - any env error is reported, the env rebuilt
                outcomes[i] = Failure(ENV_ERROR, describe_exception(exc))
                self._drop(i)
        return outcomes

    def _drop(self, i: int) -> None:
        runner, self._runners[i] = self._runners[i], None
        if runner is not None:
            with contextlib.suppress(Exception):
                runner.close()

    def _close(self) -> None:
        for i in range(len(self._runners)):
            self._drop(i)
