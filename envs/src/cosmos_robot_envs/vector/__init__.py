"""The vector layer: N copies of a gymnasium env behind one batched ``reset`` / ``step``.

Why it exists: the evaluator and the RL trainers step many envs at once, each env may run a different
task, and a long run must survive one simulator crashing or hanging. :func:`make_vector_env` builds
the envs in-process (``"sync"``), in one worker process each with shared memory for arrays
(``"async"``), or in Ray actors that may live on other machines (``"ray"``); all three behave the
same, and the same seeds give the same trajectories in each.

API (:class:`BatchedEnv`)::

    venv = make_vector_env("gym_pusht/PushT-v0", num_envs=8, mode="async", env_kwargs={"obs_type": "pixels_agent_pos"})
    obs, infos = venv.reset(seeds=[...], options=[...], mask=None)
    obs, rewards, terminated, truncated, infos = venv.step(actions, mask=None)
    venv.close()

- ``obs`` is batched: for a Dict space a dict with one ``(num_envs, ...)`` array per array key and a
  ``list[str]`` per Text key (e.g. ``prompt``); otherwise one ``(num_envs, ...)`` array. It is a copy.
- ``infos`` is a list with one dict per env (empty for envs that were not run this call).
- ``seeds`` / ``options``: per env (length ``num_envs`` or one per selected env); an int seed gives
  env i ``seed + i``; one options dict applies to every selected env. Options cross to workers as
  msgpack (numbers, str, lists, dicts, numpy arrays).
- ``mask``: a bool array of length ``num_envs`` selecting the envs to reset or step; the others keep
  their episode untouched (their row repeats their latest observation, reward 0, flags False).

Autoreset convention: **disabled, with explicit partial reset** (``AutoresetMode.DISABLED``).
``step`` never resets an env. When an episode ends, that step returns its true final observation and
final info in the usual places, and the env must be reset (``reset(mask=done, seeds=..., options=...)``)
before it is stepped again; stepping it earlier raises ``RuntimeError`` naming the env and why it
needs a reset (``needs_reset`` tells which envs do). We chose this over SAME_STEP / NEXT_STEP because
the caller picks the next episode's seed and options (the evaluator's task schedule), and the final
observation never has to be fished out of ``info``.

Worker failures: in ``"async"`` and ``"ray"`` a worker that dies (crash, SIGKILL, segfault) or gives
no reply within ``step_timeout`` is killed and replaced by a fresh one built from the same env factory
(in ``"sync"`` only an exception raised by the env is caught; the env is rebuilt). An env that
raises inside ``step`` is handled the same way. The affected env's step returns ``truncated=True``,
its previous observation, and ``info["truncated_reason"]`` (``"worker_crashed"``,
``"worker_timeout"`` or ``"env_error"``) plus ``info["worker_error"]`` (message or traceback); the
other envs' results are unaffected. A crash or hang during ``reset`` is retried once on the fresh
worker; a reset that still fails reports the same two info keys and leaves the env needing a reset.
A reset that worked only on the retry says so: its info carries ``info["reset_failure"]``
(``{"reason", "error"}`` of the failed attempt), so a caller can report the lost time instead of
never hearing of it.
"""

from cosmos_robot_envs.vector.base import RESET_FAILURE, BatchedEnv
from cosmos_robot_envs.vector.env_factory import EnvFactory
from cosmos_robot_envs.vector.factory import Mode, make_vector_env
from cosmos_robot_envs.vector.runner import ENV_ERROR, WORKER_CRASHED, WORKER_TIMEOUT

__all__ = [
    "ENV_ERROR",
    "RESET_FAILURE",
    "WORKER_CRASHED",
    "WORKER_TIMEOUT",
    "BatchedEnv",
    "EnvFactory",
    "Mode",
    "make_vector_env",
]
