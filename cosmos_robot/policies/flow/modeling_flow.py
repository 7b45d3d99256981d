"""``FlowModel``: a compact flow-matching action-chunk model that trains in minutes on a CPU.

Layout (all sizes from ``FlowConfig``)::

    images (B, ncam, 3, S, S) -> shared patch-stem CNN + camera bias -> spatial-softmax keypoints
                                 + pooled features, per camera            \
    state (B, state_dim)      -> linear                                    -> trunk MLP -> context (B, W)
    prompt                    -> hashed words/bigrams -> EmbeddingBag mean /
    x_t (B, H, D), t, context -> residual FiLM MLP (the action expert) -> velocity (B, H, D)
    context                   -> value MLP -> V (B,)                    [RL critic, shared trunk]
    expert features           -> bounded noise MLP -> std (B, H, D)     [Flow-Noise exploration]

Why this shape: the tabletop tasks need object *positions* from pixels, which spatial-softmax
keypoints give with sub-cell precision from a cheap stem (a 4x4 patch conv is one matmul; deeper
convnets cost 10x more on two CPU cores for little gain here). The expert is an MLP over the whole
flattened chunk rather than a transformer: H x D = 70 numbers need no attention, and FiLM lets the
context and time modulate every block. There is no dropout anywhere, so PPO ratios are exactly 1
before the first update.

Time convention is openpi's pi0 (and RLinf's): t runs from 1 (pure noise) to 0 (data),
``x_t = (1 - t) * a + t * eps`` and the target velocity is ``v = eps - a``; training draws t from
Beta(1.5, 1) (more weight on noisy t, like openpi) or U(0, 1), mapped into [0.001, 1].
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from cosmos_robot.policies.flow.configuration_flow import FlowConfig
from cosmos_robot.policies.flow.text import encode_prompts
from cosmos_robot.policies.interfaces import RLModel

__all__ = ["FlowModel", "draw_rand", "draw_randn", "time_embedding"]


def _gen_device(generator: torch.Generator | None, device: Any) -> Any:
    return generator.device if generator is not None else device


def draw_randn(shape: tuple[int, ...], generator: torch.Generator | None, device: Any = None) -> torch.Tensor:
    """N(0, 1) drawn on the generator's device (a CPU generator also serves a CUDA model), then moved."""
    return torch.randn(shape, generator=generator, device=_gen_device(generator, device)).to(device)


def draw_rand(shape: tuple[int, ...], generator: torch.Generator | None, device: Any = None) -> torch.Tensor:
    """U(0, 1) drawn like ``draw_randn``."""
    return torch.rand(shape, generator=generator, device=_gen_device(generator, device)).to(device)


def time_embedding(t: torch.Tensor, dim: int, min_period: float = 4e-3, max_period: float = 4.0) -> torch.Tensor:
    """openpi's sin/cos embedding of t in [0, 1]: periods spaced geometrically in [min, max]."""
    fraction = torch.linspace(0.0, 1.0, dim // 2, device=t.device, dtype=torch.float32)
    period = min_period * (max_period / min_period) ** fraction
    angle = t.float()[:, None] * (2.0 * math.pi / period)[None, :]
    return torch.cat([torch.sin(angle), torch.cos(angle)], dim=-1)


def _mlp(sizes: list[int], zero_last: bool = False) -> nn.Sequential:
    layers: list[nn.Module] = []
    for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])):
        layers.append(nn.Linear(a, b))
        if i < len(sizes) - 2:
            layers.append(nn.GELU())
    if zero_last:
        last = layers[-1]
        assert isinstance(last, nn.Linear)
        nn.init.zeros_(last.weight)
        nn.init.zeros_(last.bias)
    return nn.Sequential(*layers)


class ImageEncoder(nn.Module):
    """Shared CNN over every camera; returns ``(B, ncam * out_dim)`` keypoint + pooled features."""

    grid: torch.Tensor  # (cells^2, 2) feature-cell centres in [-1, 1]; derived from the config, not saved

    def __init__(self, cfg: FlowConfig) -> None:
        super().__init__()
        c, p = cfg.encoder_channels, cfg.encoder_patch
        self.stem = nn.Conv2d(3, c, kernel_size=p, stride=p)
        self.camera_bias = nn.Parameter(torch.zeros(len(cfg.cameras), c))  # tells the shared CNN which view
        self.convs = nn.ModuleList(nn.Conv2d(c, c, 3, padding=1) for _ in range(cfg.encoder_convs))
        self.keypoints = nn.Conv2d(c, cfg.num_keypoints, 1)
        self.log_temperature = nn.Parameter(torch.zeros(()))
        cells = cfg.image_size // p
        ys, xs = torch.meshgrid(torch.linspace(-1, 1, cells), torch.linspace(-1, 1, cells), indexing="ij")
        self.register_buffer("grid", torch.stack([xs.reshape(-1), ys.reshape(-1)], dim=-1), persistent=False)
        self.num_cameras = len(cfg.cameras)
        self.out_dim = 2 * cfg.num_keypoints + c

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        b, n = images.shape[:2]
        x = images.flatten(0, 1)
        x = x.float() / 255.0 if x.dtype == torch.uint8 else x.float()
        x = (x * 2.0 - 1.0).contiguous(memory_format=torch.channels_last)
        h = self.stem(x) + self.camera_bias.repeat(b, 1)[:, :, None, None]
        h = F.gelu(h)
        for conv in self.convs:
            h = h + F.gelu(conv(h))
        logits = self.keypoints(h).flatten(2) * torch.exp(-self.log_temperature)  # (B*n, K, cells^2)
        points = torch.softmax(logits, dim=-1) @ self.grid  # expected (x, y) per keypoint
        feats = torch.cat([points.flatten(1), h.mean(dim=(2, 3))], dim=-1)
        return feats.reshape(b, n * self.out_dim)


class FiLMBlock(nn.Module):
    """Residual MLP block whose normalised input is scaled and shifted by the condition."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width, elementwise_affine=False)
        self.film = nn.Linear(width, 2 * width)
        self.fc1 = nn.Linear(width, width)
        self.fc2 = nn.Linear(width, width)
        for layer in (self.film, self.fc2):  # start as the identity (adaLN-zero)
            nn.init.zeros_(layer.weight)
            nn.init.zeros_(layer.bias)

    def forward(self, h: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
        scale, shift = self.film(cond).chunk(2, dim=-1)
        return h + self.fc2(F.gelu(self.fc1(self.norm(h) * (1.0 + scale) + shift)))


class FlowModel(RLModel):
    """Encoder + trunk + action expert + value head + bounded noise head (see the module docstring).

    Batches are dicts of tensors:

    - ``images``: ``(B, ncam, 3, S, S)`` uint8 (0..255) or float in [0, 1], cameras in ``config.cameras`` order
      (not read by a camera-free policy, ``config.cameras == ()``);
    - ``state``: ``(B, state_dim)`` float, already normalised with the checkpoint's stats (the vectors of
      ``config.state_keys`` concatenated);
    - the instruction as ``text_ids`` + ``text_offsets`` (``text.encode_prompts``) or ``prompt``: list of str;
    - for ``flow_loss`` also ``actions``: ``(B, H, D)`` normalised, and optionally ``action_pad_mask``:
      ``(B, H)`` bool, True where the step is padding past the episode end. Padded steps are left
      out of the loss but still enter the expert as part of the noisy chunk, so fill them with
      something plausible (LeRobot repeats the last real action, which is what we want).
    """

    config: FlowConfig

    def __init__(self, config: FlowConfig) -> None:
        super().__init__()
        self.config = config
        cfg = config
        chunk = cfg.chunk_size * cfg.action_dim
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(cfg.seed)  # the same config builds the same initial weights
            # a camera-free (state) policy has no encoder: no parameters that never see a gradient
            self.image_encoder = ImageEncoder(cfg) if cfg.cameras else None
            self.state_proj = nn.Linear(cfg.state_dim, cfg.state_embed_dim)
            self.text_embed = nn.EmbeddingBag(cfg.text_buckets, cfg.text_dim, mode="mean")
            nn.init.normal_(self.text_embed.weight, std=0.1)
            image_dim = len(cfg.cameras) * self.image_encoder.out_dim if self.image_encoder is not None else 0
            trunk_in = image_dim + cfg.state_embed_dim + cfg.text_dim
            self.trunk = _mlp([trunk_in] + [cfg.trunk_width] * cfg.trunk_depth)
            self.trunk_norm = nn.LayerNorm(cfg.trunk_width)
            w = cfg.expert_width
            self.time_mlp = _mlp([cfg.time_embed_dim, w, w])
            self.context_proj = nn.Linear(cfg.trunk_width, w)
            self.action_in = nn.Linear(chunk, w)
            self.blocks = nn.ModuleList(FiLMBlock(w) for _ in range(cfg.expert_depth))
            self.expert_norm = nn.LayerNorm(w)
            self.velocity_out = nn.Linear(w, chunk)
            self.value_head = _mlp([cfg.trunk_width, *cfg.value_widths, 1], zero_last=True)
            self.noise_head = _mlp([w, *cfg.noise_widths, chunk], zero_last=True)

    # --- observation -> context ------------------------------------------------------------------
    def encode(self, batch: Mapping[str, Any]) -> torch.Tensor:
        """The shared context ``(B, trunk_width)`` from images, state and instruction."""
        cfg = self.config
        state = batch["state"]
        if state.ndim != 2 or state.shape[1] != cfg.state_dim:
            raise ValueError(f"state: expected shape (B, {cfg.state_dim}), got {tuple(state.shape)}")
        if not cfg.read_prompt:  # a prompt-free policy: whatever the batch says, the empty instruction
            ids, offsets = encode_prompts([""] * state.shape[0], cfg.text_buckets)
        elif "text_ids" in batch:
            ids, offsets = batch["text_ids"], batch["text_offsets"]
        elif "prompt" in batch:
            ids, offsets = encode_prompts(batch["prompt"], cfg.text_buckets)
        else:
            raise KeyError("batch needs the instruction: 'text_ids' + 'text_offsets' or 'prompt' (list of str)")
        device = state.device
        parts = [F.gelu(self.state_proj(state.float())), self.text_embed(ids.to(device), offsets.to(device))]
        if self.image_encoder is not None:
            images = batch["images"]
            want = (len(cfg.cameras), 3, cfg.image_size, cfg.image_size)
            if images.ndim != 5 or tuple(images.shape[1:]) != want:
                raise ValueError(f"images: expected shape (B, {', '.join(map(str, want))}), got {tuple(images.shape)}")
            parts.insert(0, self.image_encoder(images.to(device)))
        return self.trunk_norm(F.gelu(self.trunk(torch.cat(parts, dim=-1))))

    # --- action expert ---------------------------------------------------------------------------
    def expert(
        self, x_t: torch.Tensor, t: torch.Tensor | float, context: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(velocity (B, H, D), features (B, expert_width))`` at noisy chunk ``x_t`` and time ``t``."""
        b = x_t.shape[0]
        t = torch.as_tensor(t, dtype=torch.float32, device=x_t.device)
        if t.ndim == 0:
            t = t.expand(b)
        cond = F.gelu(self.context_proj(context) + self.time_mlp(time_embedding(t, self.config.time_embed_dim)))
        h = self.action_in(x_t.reshape(b, -1).float())
        for block in self.blocks:
            h = block(h, cond)
        feats = self.expert_norm(h)
        return self.velocity_out(feats).reshape(x_t.shape), feats

    def velocity(self, x_t: torch.Tensor, t: torch.Tensor | float, context: torch.Tensor) -> torch.Tensor:
        """The predicted flow velocity ``v(x_t, t, context)`` (``eps - a`` at the optimum)."""
        return self.expert(x_t, t, context)[0]

    # --- RL heads --------------------------------------------------------------------------------
    def value(self, context: torch.Tensor, detach: bool = False) -> torch.Tensor:
        """State value ``(B,)`` on the shared trunk; ``detach`` stops critic gradients into the trunk."""
        return self.value_head(context.detach() if detach else context).squeeze(-1)

    def noise_std(self, features: torch.Tensor) -> torch.Tensor:
        """Flow-Noise std ``(B, H, D)``, tanh-squashed in log space into [noise_std_min, noise_std_max]."""
        cfg = self.config
        lo, hi = math.log(cfg.noise_std_min), math.log(cfg.noise_std_max)
        z = torch.tanh(self.noise_head(features))
        return torch.exp(lo + (hi - lo) * 0.5 * (z + 1.0)).reshape(-1, cfg.chunk_size, cfg.action_dim)

    # --- training --------------------------------------------------------------------------------
    def sample_time(self, n: int, generator: torch.Generator | None = None, device: Any = None) -> torch.Tensor:
        """Flow times in [0.001, 1]: Beta(1.5, 1) by inverse CDF (u ** (1 / 1.5)) or uniform."""
        u = draw_rand((n,), generator, device)
        t = u.pow(1.0 / 1.5) if self.config.time_sampling == "beta" else u
        return t * 0.999 + 0.001

    def flow_loss(
        self,
        batch: Mapping[str, Any],
        generator: torch.Generator | None = None,
        noise: torch.Tensor | None = None,
        time: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """Flow-matching loss (mean squared velocity error over real steps) and metrics.

        ``noise`` (B, H, D) and ``time`` (B,) may be given for reproducibility; otherwise they are
        drawn from ``generator`` (or the global RNG).
        """
        cfg = self.config
        actions = batch["actions"]
        want = (cfg.chunk_size, cfg.action_dim)
        if actions.ndim != 3 or tuple(actions.shape[1:]) != want:
            raise ValueError(f"actions: expected shape (B, {want[0]}, {want[1]}), got {tuple(actions.shape)}")
        context = self.encode(batch)
        a = actions.to(context.device).float()
        b = a.shape[0]
        eps = noise.to(a.device).float() if noise is not None else draw_randn(tuple(a.shape), generator, a.device)
        t = time if time is not None else self.sample_time(b, generator, a.device)
        tt = t.to(a.device)[:, None, None]
        x_t = (1.0 - tt) * a + tt * eps
        err = (self.velocity(x_t, t, context) - (eps - a)).pow(2)
        pad = batch.get("action_pad_mask")
        if pad is None:
            loss = err.mean()
            real = float(b * cfg.chunk_size)
        else:
            keep = (~pad.to(a.device).bool()).float()[:, :, None]
            real = float(keep.sum())
            loss = (err * keep).sum() / max(real * cfg.action_dim, 1.0)
        return loss, {"flow_loss": float(loss.detach()), "real_steps": real}
