"""``Cosmos3Policy``: a Cosmos3 diffusers pipeline folder behind the ``BatchPolicy`` interface.

The folder is what diffusers writes (``model_index.json``, ``transformer/``, ``vae/``,
``scheduler/``, ``text_tokenizer/``); ``Cosmos3OmniPipeline.from_pretrained`` loads it. Which
cosmos-framework conventions apply (``conventions.DROID`` or ``LIBERO``) comes from
``cosmos_robot_policy.json`` (``{"embodiment": "droid"|"libero", "settings": {...},
"stats_file": ...}``) or, for cosmos-framework exports, ``checkpoint.json``'s
``policy.domain_name``. LIBERO needs its action stats file (the ``global_raw`` q01/q99).

Requests, per embodiment (openpi / RoboArena / RoboLab DROID keys; openpi LIBERO keys):

- droid: the three views ``observation/exterior_image_1_left``, ``observation/exterior_image_2_left``,
  ``observation/wrist_image_left`` (HxWx3 uint8; RoboArena / openpi DROID clients) OR the canvas
  they compose, ``observation/image`` (RoboLab's cosmos3 client sends it at 540x640), plus
  ``observation/joint_position`` (7), ``observation/gripper_position`` ((1,), (T,), (T, 1) or a 0-D
  scalar; 0 open .. 1 closed; the last value is used), ``prompt`` -> ``actions`` (32, 8): absolute
  joint positions + gripper (1 = closed), also under ``action``, the key cosmos-framework's RoboLab
  server replies with and RoboLab's ``Cosmos3Client`` reads;
- libero: ``observation/image``, ``observation/wrist_image``, ``prompt`` (``observation/state`` is
  accepted and unused) -> ``actions`` (16, 7): ``[dpos, drotvec, gripper in -1..1]``.

Each observation is one transformer sequence (the model packs no batch), so ``infer_batch`` runs
them one after another; the sampling seed is ``serve_seed`` for every request (deterministic).
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from cosmos_robot.policies.compiling import compile_blocks
from cosmos_robot.policies.cosmos3.conventions import (
    DROID_CANVAS_HW,
    EMBODIMENTS,
    Embodiment,
    droid_canvas,
    droid_composite,
    libero_command,
    libero_composite,
    with_overrides,
)
from cosmos_robot.policies.cosmos3.sampler import Cosmos3Sampler
from cosmos_robot.policies.registry import CheckpointError, read_json, torch_dtype
from cosmos_robot.policies.shape_events import ShapeCounted
from cosmos_robot_client.base_policy import BatchPolicy
from cosmos_robot_client.spec import ArraySpec, InputSpec, ObservationError, TextSpec

__all__ = ["POLICY_FILE", "Cosmos3Policy"]

POLICY_FILE = "cosmos_robot_policy.json"
_DOMAINS = {"droid_lerobot": "droid", "droid": "droid", "libero": "libero"}
_IGNORED = frozenset({"session_id", "endpoint", "observation/object_state", "observation/cartesian_position"})


CANVAS_KEY = "observation/image"
VIEW_KEYS = ("observation/exterior_image_1_left", "observation/exterior_image_2_left", "observation/wrist_image_left")
STATE_KEYS = ("observation/joint_position", "observation/gripper_position", "prompt")


def _spec(embodiment: Embodiment) -> InputSpec:
    img = ArraySpec((None, None, 3), "uint8")
    if embodiment.name == "droid":
        # the views and the canvas are optional fields; the spec's layouts require exactly one of the two
        view = ArraySpec((None, None, 3), "uint8", optional=True, description="one of the three DROID views")
        fields: dict[str, ArraySpec | TextSpec] = {
            **{key: view for key in VIEW_KEYS},
            CANVAS_KEY: ArraySpec(
                (None, None, 3), "uint8", optional=True, description="wrist on top, exterior 1 | 2 below (540x640)"
            ),
            "observation/joint_position": ArraySpec((7,), "number"),
            "observation/gripper_position": ArraySpec(
                (None,), "number", alt_shapes=((), (None, 1)), description="0 = open .. 1 = closed"
            ),
            "prompt": TextSpec(),
        }
        return InputSpec(fields, allow_extra=False, ignored_keys=_IGNORED, layouts=(VIEW_KEYS, (CANVAS_KEY,)))
    fields = {
        "observation/image": img,
        "observation/wrist_image": img,
        "observation/state": ArraySpec((None,), "number", optional=True, description="accepted, unused"),
        "prompt": TextSpec(),
    }
    return InputSpec(fields, allow_extra=False, ignored_keys=_IGNORED)


class Cosmos3Policy(ShapeCounted, BatchPolicy):
    """Serve a Cosmos3 action-policy pipeline with cosmos-framework's conventions."""

    def __init__(
        self, pipe: Any, embodiment: Embodiment, stats: Mapping[str, np.ndarray] | None = None, serve_seed: int = 0
    ) -> None:
        if embodiment.name == "libero" and stats is None:
            raise ValueError("the libero conventions need the action stats (q01/q99 of the 10-D actions)")
        self.pipe, self.embodiment, self.stats, self.serve_seed = pipe, embodiment, stats, serve_seed
        self.sampler = Cosmos3Sampler(pipe)
        self._spec = _spec(embodiment)

    @classmethod
    def from_pretrained(
        cls, ckpt_dir: str | Path, device: str = "cpu", dtype: str | None = None, compile: bool = False
    ) -> Cosmos3Policy:
        """Load a diffusers Cosmos3 pipeline folder. ``dtype``: the weights' dtype (default: bfloat16
        on CUDA, float32 on the CPU; diffusers keeps the modules it must in float32). ``compile``:
        ``torch.compile`` each transformer block (1.3x on an H200 at Cosmos3-Nano's size, see
        docs/benchmarks.md; the first chunk then takes a minute)."""
        root = Path(ckpt_dir)
        weights_dtype = torch_dtype(dtype or ("bfloat16" if str(device).startswith("cuda") else "float32"))
        index = read_json(root / "model_index.json")
        missing = [
            name
            for name in ("transformer", "vae", "scheduler", "text_tokenizer")
            if name in index and not (root / name).is_dir()
        ]
        if missing:
            raise CheckpointError(f"{root}: model_index.json names {missing} but the folder lacks those subfolders")
        embodiment, stats = _conventions(root)
        from diffusers import Cosmos3OmniPipeline

        try:
            pipe = Cosmos3OmniPipeline.from_pretrained(
                str(root), enable_safety_checker=False, **_dtype_kwarg(weights_dtype)
            )
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise CheckpointError(f"{root}: diffusers could not load the Cosmos3 pipeline: {exc}") from exc
        if not getattr(pipe.transformer.config, "action_gen", False):
            raise CheckpointError(f"{root}/transformer: action_gen is false: this checkpoint generates no actions")
        pipe.to(device)
        pipe.set_progress_bar_config(disable=True)
        if compile:
            compile_blocks(pipe.transformer)
        return cls(pipe, embodiment, stats)

    # --- BasePolicy ------------------------------------------------------------------------------
    @property
    def metadata(self) -> dict[str, Any]:
        s = self.embodiment.settings
        meta: dict[str, Any] = {
            "type": "cosmos3",
            "embodiment": self.embodiment.name,
            "action_horizon": s.chunk,
            "action_dim": self.embodiment.action_dim,
            "action_space": self.embodiment.action_space,
            "num_flow_steps": s.num_steps,
            "guidance": s.guidance,
            "expected_keys": sorted(self._spec.fields),
        }
        if self.embodiment.name == "droid":
            meta.update(  # RoboArena's PolicyServerConfig fields
                image_resolution=None,
                needs_wrist_camera=True,
                n_external_cameras=2,
                needs_stereo_camera=False,
                needs_session_id=False,
            )
            meta.update(  # what RoboLab / RoboArena / cosmos-framework clients need to know
                observation_layouts={
                    "views": [*VIEW_KEYS, *STATE_KEYS],
                    "canvas": [CANVAS_KEY, *STATE_KEYS],
                },
                canvas_resolution=list(DROID_CANVAS_HW),
                gripper_convention={
                    "observation/gripper_position": "0 = open .. 1 = closed; (1,), (T,), (T, 1) or a scalar",
                    "actions[:, 7]": "0 = open .. 1 = closed (continuous; RoboLab clients close above 0.5)",
                },
                action_keys=["actions", "action"],
            )
        return meta

    @property
    def input_spec(self) -> InputSpec:
        return self._spec

    def _check(self, obs: Mapping[str, Any], index: int) -> None:
        missing = [k for k, f in self._spec.fields.items() if not getattr(f, "optional", False) and k not in obs]
        if missing:
            close = difflib.get_close_matches(missing[0], [str(k) for k in obs], n=1)
            hint = f" (got {close[0]!r}?)" if close else ""
            raise ObservationError(
                missing[0], f"observation {index}: missing for the {self.embodiment.name} conventions{hint}"
            )
        self._spec.validate(obs)  # also: exactly one image layout (three views or the canvas)

    def infer_batch(self, obs_batch: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
        out = []
        for i, obs in enumerate(obs_batch):
            self._check(obs, i)
            actions = self._one(obs)
            # cosmos-framework's RoboLab server names the chunk ``action``; openpi clients read ``actions``
            droid = self.embodiment.name == "droid"
            out.append({"actions": actions, "action": actions} if droid else {"actions": actions})
        return out

    def _one(self, obs: Mapping[str, Any]) -> np.ndarray:
        s = self.embodiment.settings
        if self.embodiment.name == "droid":
            if CANVAS_KEY in obs:
                image = droid_canvas(np.asarray(obs[CANVAS_KEY]))
            else:
                image = droid_composite(
                    np.asarray(obs["observation/wrist_image_left"]),
                    np.asarray(obs["observation/exterior_image_1_left"]),
                    np.asarray(obs["observation/exterior_image_2_left"]),
                )
            q = np.asarray(obs["observation/joint_position"], np.float32).reshape(7)
            g = float(np.asarray(obs["observation/gripper_position"], np.float32).reshape(-1)[-1])
            state = np.concatenate([q, [1.0 - g]]).astype(np.float32)  # the model's gripper is flipped
            rows, _ = self.sampler.sample(image, str(obs["prompt"]), s, state, self.serve_seed)
            rows = rows.copy()
            rows[:, 7] = 1.0 - rows[:, 7]
            return rows.astype(np.float32)
        image = libero_composite(np.asarray(obs["observation/image"]), np.asarray(obs["observation/wrist_image"]))
        rows, _ = self.sampler.sample(image, str(obs["prompt"]), s, None, self.serve_seed)
        assert self.stats is not None
        return libero_command(rows, self.stats["q01"], self.stats["q99"])


def _conventions(root: Path) -> tuple[Embodiment, dict[str, np.ndarray] | None]:
    """The embodiment (+ overrides) and LIBERO stats of a folder; every gap is a named error."""
    policy_file, ckpt_file = root / POLICY_FILE, root / "checkpoint.json"
    if policy_file.is_file():
        cfg = read_json(policy_file)
        name = cfg.get("embodiment")
        where = str(policy_file)
    elif ckpt_file.is_file():
        domain = (read_json(ckpt_file).get("policy") or {}).get("domain_name")
        name, cfg, where = _DOMAINS.get(str(domain)), {}, f"{ckpt_file} (policy.domain_name {domain!r})"
    else:
        raise CheckpointError(
            f"{root}: a Cosmos3 pipeline folder, but which policy conventions apply is not recorded: add {POLICY_FILE} "
            f'with {{"embodiment": "droid"}} or {{"embodiment": "libero", "stats_file": "..."}}'
        )
    if name not in EMBODIMENTS:
        raise CheckpointError(f"{where}: embodiment {name!r} is not one of {sorted(EMBODIMENTS)}")
    try:
        emb = with_overrides(EMBODIMENTS[name], dict(cfg.get("settings") or {}), where)
    except (ValueError, TypeError) as exc:
        raise CheckpointError(str(exc)) from exc
    if emb.name != "libero":
        return emb, None
    stats_name = cfg.get("stats_file", "libero_native_frame_wise_relative_rot6d.json")
    stats_path = root / stats_name
    if not stats_path.is_file():
        raise CheckpointError(
            f"{root}: the libero conventions de-normalise actions with {stats_name} (cosmos-framework's "
            "normalizer stats, key 'global_raw'); it is missing"
        )
    data = read_json(stats_path)
    raw = data.get("global_raw")
    if not isinstance(raw, dict) or "q01" not in raw or "q99" not in raw:
        raise CheckpointError(f"{stats_path}: expected a 'global_raw' table with q01 and q99")
    q01, q99 = np.asarray(raw["q01"], np.float64), np.asarray(raw["q99"], np.float64)
    if q01.shape != (10,) or q99.shape != (10,):
        raise CheckpointError(f"{stats_path}: global_raw q01/q99 must have 10 values, got {q01.shape} / {q99.shape}")
    return emb, {"q01": q01, "q99": q99}


def _dtype_kwarg(dtype: Any) -> dict[str, Any]:
    """diffusers 0.42 renamed ``from_pretrained``'s ``torch_dtype`` to ``dtype`` (the old name warns)."""
    import diffusers
    from packaging.version import Version

    return {"dtype" if Version(diffusers.__version__) >= Version("0.42") else "torch_dtype": dtype}
