"""``FlowConfig``: every number that shapes the embedded flow policy, validated, saved as ``config.json``.

Why one flat, strict config: the checkpoint folder must rebuild the identical model from this file
alone (``FlowModel(FlowConfig(**json))``), and a typo or an impossible combination (an image size
the patch stem cannot tile, a noise bound above its ceiling) must fail when the recipe is read,
naming the field, not as a shape error deep in a forward pass. Field comments give unit and purpose.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from cosmos_robot.config import StrictModel
from cosmos_robot.normalize import NormMode

__all__ = ["FlowConfig"]


class FlowConfig(StrictModel):
    """The embedded flow-matching action-chunk policy (``config.json`` of a ``flow`` checkpoint)."""

    type: Literal["flow"] = "flow"  # family name read by the policy registry; always "flow"

    # --- observation / action layout -------------------------------------------------------------
    image_size: int = Field(default=64, ge=16, le=512)  # model input side in pixels; the policy resizes incoming images
    # camera names, wire key "observation/<name>"; empty: a camera-free (state) policy
    cameras: tuple[str, ...] = ("image", "wrist_image")
    # observation vectors concatenated, in order, into the model's state (wire key "observation/<name>");
    # a camera-free tabletop policy reads ("state", "object_state")
    state_keys: tuple[str, ...] = ("state",)
    # wire shapes of state keys that arrive as arrays, flattened row-major into the state (AlpaSim's
    # observation/ego_history (16, 3) and observation/route (20, 3)); a key not named here is a flat vector
    state_shapes: dict[str, tuple[int, ...]] = Field(default_factory=dict)
    state_dim: int = Field(
        default=8, ge=1
    )  # length of the concatenated state (tabletop: eef pos 3, axis-angle 3, fingers 2; + object_state 15)
    # read the instruction (wire key "prompt"); False: a prompt-free policy (driving planners, whose
    # AlpaSim requests carry none): no prompt on the wire, the model embeds the empty instruction
    read_prompt: bool = True
    action_dim: int = Field(default=7, ge=1)  # action length per step (tabletop: dpos 3, drot 3, gripper 1)
    chunk_size: int = Field(default=10, ge=1)  # H: action rows the model predicts per call (steps; was `horizon`)
    num_flow_steps: int = Field(default=10, ge=1)  # K: Euler steps of the denoising ODE (serving) and of SDE rollouts
    # actions a client should execute from each chunk before asking again, the horizon the checkpoint was
    # validated at; announced as server metadata "replan_steps", and `cosmos-robot eval` uses it when
    # --replan-steps is not given. None: announce nothing (eval's default, 5)
    replan_steps: int | None = Field(default=None, ge=1)
    # action dims executed as their sign, -1 / +1 (a gripper; tabletop: [6]): the BinarizeActions output
    # transform, so serving, eval and RL rollouts all execute the snapped command
    binarize_action_dims: tuple[int, ...] = ()

    # --- vision encoder (shared across cameras) --------------------------------------------------
    encoder_patch: int = Field(
        default=4, ge=1
    )  # stem stride = kernel (pixels per feature cell); image_size % patch == 0
    encoder_channels: int = Field(default=32, ge=4)  # conv width of the stem and the 3x3 convs
    encoder_convs: int = Field(default=2, ge=0)  # number of 3x3 convs after the stem (receptive field 1 + 2*n cells)
    num_keypoints: int = Field(default=32, ge=1)  # spatial-softmax keypoints per camera (each gives an (x, y) feature)

    # --- trunk (shared context for the expert, value head and noise head) ------------------------
    state_embed_dim: int = Field(default=64, ge=1)  # width of the state projection fed to the trunk
    text_buckets: int = Field(default=4096, ge=2)  # hashed word/bigram vocabulary (crc32 % buckets); bucket 0 = empty
    text_dim: int = Field(default=64, ge=1)  # instruction embedding width (EmbeddingBag mean over hashed tokens)
    trunk_width: int = Field(default=256, ge=8)  # context vector width
    trunk_depth: int = Field(default=2, ge=1)  # hidden layers of the trunk MLP

    # --- action expert (velocity field over the flattened H x D chunk) ---------------------------
    expert_width: int = Field(default=256, ge=8)  # hidden width of the residual FiLM MLP
    expert_depth: int = Field(default=3, ge=1)  # residual blocks
    time_embed_dim: int = Field(default=64, ge=4)  # sinusoidal embedding width of the flow time t (even)

    # --- RL heads --------------------------------------------------------------------------------
    value_widths: tuple[int, ...] = (256, 128)  # hidden widths of the value MLP on the trunk context
    noise_widths: tuple[int, ...] = (128, 64)  # hidden widths of the Flow-Noise std MLP on expert features
    noise_std_min: float = Field(
        default=0.08, gt=0.0
    )  # lower bound of the learned Flow-Noise std (normalised action units)
    noise_std_max: float = Field(default=0.16, gt=0.0)  # upper bound of the learned Flow-Noise std
    noise_level: float = Field(default=0.5, gt=0.0)  # a in Flow-SDE sigma_t = a * sqrt(t / (1 - t))

    # --- training / serving conventions ----------------------------------------------------------
    time_sampling: Literal["beta", "uniform"] = "beta"  # flow-loss t: openpi's Beta(1.5, 1) (noisier t) or U(0, 1)
    norm_mode: NormMode = "mean_std"  # how state and actions are normalised with the checkpoint's stats
    serve_noise: Literal["fixed", "zero", "random"] = "fixed"  # serving x_1: seeded, all-zero, or fresh each call
    serve_seed: int = 0  # seed of the fixed serving noise (identical inputs -> identical actions)
    seed: int = 0  # weight-initialisation seed (FlowModel(config) is deterministic)

    @model_validator(mode="before")
    @classmethod
    def _legacy_horizon(cls, data: Any) -> Any:
        """Folders and recipes written before issue 14 call ``chunk_size`` ``horizon``: read it as such."""
        if not isinstance(data, dict) or "horizon" not in data:
            return data
        if "chunk_size" in data:
            raise ValueError(
                f"both 'chunk_size' ({data['chunk_size']!r}) and its old name 'horizon' ({data['horizon']!r}) "
                "are set; keep only 'chunk_size'"
            )
        data = dict(data)
        data["chunk_size"] = data.pop("horizon")
        return data

    @field_validator("cameras", "state_keys")
    @classmethod
    def _names_ok(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        if len(set(value)) != len(value):
            raise ValueError(f"names repeat: {list(value)}")
        for name in value:
            if not name.isidentifier():
                raise ValueError(f"name {name!r} must be an identifier (it becomes 'observation/{name}')")
        return value

    @field_validator("state_keys")
    @classmethod
    def _some_state(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        if not value:
            raise ValueError("needs at least one observation vector (usually 'state')")
        return value

    @model_validator(mode="after")
    def _shapes_ok(self) -> FlowConfig:
        unknown = sorted(set(self.state_shapes) - set(self.state_keys))
        if unknown:
            raise ValueError(f"state_shapes names {unknown}, which are not state_keys {list(self.state_keys)}")
        for key, shape in self.state_shapes.items():
            if not shape or any(int(d) < 1 for d in shape):
                raise ValueError(f"state_shapes[{key!r}]: expected positive sizes, got {list(shape)}")
        return self

    @model_validator(mode="after")
    def _binarize_dims_ok(self) -> FlowConfig:
        dims = self.binarize_action_dims
        if len(set(dims)) != len(dims) or any(not 0 <= d < self.action_dim for d in dims):
            raise ValueError(
                f"binarize_action_dims: expected distinct indices in [0, {self.action_dim}) (action_dim), "
                f"got {list(dims)}"
            )
        return self

    @model_validator(mode="after")
    def _replan_fits(self) -> FlowConfig:
        if self.replan_steps is not None and self.replan_steps > self.chunk_size:
            raise ValueError(
                f"replan_steps={self.replan_steps}: a client cannot execute more actions than a chunk holds "
                f"(chunk_size={self.chunk_size})"
            )
        return self

    @field_validator("time_embed_dim")
    @classmethod
    def _even(cls, value: int) -> int:
        if value % 2:
            raise ValueError(f"must be even (sin and cos halves), got {value}")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> FlowConfig:
        if self.image_size % self.encoder_patch:
            raise ValueError(
                f"image_size ({self.image_size}) must be a multiple of encoder_patch ({self.encoder_patch})"
            )
        shared = sorted(set(self.cameras) & set(self.state_keys))
        if shared:
            raise ValueError(f"cameras and state_keys share {shared}: a wire key is either an image or a vector")
        if not self.noise_std_min < self.noise_std_max:
            raise ValueError(f"noise_std_min ({self.noise_std_min}) must be below noise_std_max ({self.noise_std_max})")
        return self

    @property
    def wire_keys(self) -> dict[str, str]:
        """Wire (openpi) key -> model key: ``observation/image`` -> ``image``, ``observation/state`` -> ``state``."""
        return {f"observation/{name}": name for name in (*self.cameras, *self.state_keys)}
