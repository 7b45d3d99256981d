"""Loading a pi05 export of non-released sizes into LeRobot 0.6.1's own ``PI05Policy``.

LeRobot 0.6.1 builds exactly one pi0.5 size: ``PI05Config`` accepts only the variant names
``gemma_2b`` and ``gemma_300m`` (``__post_init__`` refuses others), ``get_gemma_config`` maps them to
the released widths, and ``PaliGemmaWithExpertModel.__init__`` hard-codes SigLIP so400m's shape
(4304-wide MLP), a 2048-wide projector and a 257152-token vocabulary. A folder of any other size
(our tiny test and debug models) therefore keeps LeRobot's variant names in ``config.json`` and its
real sizes in ``pi05_architecture.json`` (which LeRobot ignores), and stock LeRobot cannot load it: it
builds the 4 B-parameter model and fails on the first tensor shape.

``lerobot_pi05_sizes(folder)`` makes LeRobot build the folder's sizes while the block runs, and
nothing else: ``get_gemma_config`` answers the two variant names with the sizes of
``pi05_architecture.json``, and after LeRobot's own ``PaliGemmaWithExpertModel.__init__`` the
PaliGemma and expert modules are rebuilt by LeRobot's own classes from LeRobot's own config with the
hard-coded numbers replaced. Loading (``PI05Policy.from_pretrained``, strict), the forward pass, the
sampler and the processors are LeRobot's code unchanged. For released sizes it is a no-op.

    with lerobot_pi05_sizes("exports/pi05"):
        policy = PI05Policy.from_pretrained("exports/pi05")
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from cosmos_robot_exporters.base import ExportError

__all__ = ["lerobot_pi05_sizes"]

ARCH_FILE = "pi05_architecture.json"
_RELEASED_VARIANTS = ("gemma_2b", "gemma_300m")


def _spec_fits(spec: Any) -> None:
    if spec.rms_eps != 1e-6 or spec.rope_theta != 10_000.0:
        raise ExportError(
            f"{ARCH_FILE}: rms_eps {spec.rms_eps} / rope_theta {spec.rope_theta} cannot be expressed in "
            "LeRobot's pi05 (it uses Gemma's 1e-6 and 10000)"
        )


@contextlib.contextmanager
def lerobot_pi05_sizes(folder: str | Path) -> Iterator[None]:
    """While in the block, LeRobot's ``PI05Policy`` builds the sizes of ``folder/pi05_architecture.json``."""
    from cosmos_robot.policies.pi05.modeling import Pi05Architecture

    root = Path(folder)
    arch_path = root / ARCH_FILE
    if not arch_path.is_file():  # the released sizes: LeRobot builds them itself
        yield
        return
    arch = Pi05Architecture.from_dict(json.loads(arch_path.read_text()))
    config = json.loads((root / "config.json").read_text())
    names = (config.get("paligemma_variant", "gemma_2b"), config.get("action_expert_variant", "gemma_300m"))
    if names[0] == names[1] and arch.vlm != arch.expert:
        raise ExportError(f"{root / 'config.json'}: both variants are {names[0]!r} but {ARCH_FILE} gives two sizes")
    for spec in (arch.vlm, arch.expert):
        _spec_fits(spec)
    if arch.vision.eps != 1e-6:
        raise ExportError(f"{ARCH_FILE}: vision eps {arch.vision.eps} cannot be expressed in LeRobot's pi05 (1e-6)")

    import lerobot.policies.pi05.modeling_pi05 as m

    sizes = dict(zip(names, (arch.vlm, arch.expert)))
    stock_get, stock_init, stock_mapping = m.get_gemma_config, m.PaliGemmaWithExpertModel.__init__, m.CONFIG_MAPPING
    vision = arch.vision

    def get_gemma_config(variant: str) -> Any:
        if variant not in sizes:
            return stock_get(variant)
        s = sizes[variant]
        return m.GemmaConfig(s.width, s.depth, s.mlp_dim, s.num_heads, s.num_kv_heads, s.head_dim)

    class _Mapping:  # a small vision tower from the start (the stock so400m would take seconds and GBs)
        def __getitem__(self, key: str) -> Any:
            factory = stock_mapping[key]
            if key != "paligemma":
                return factory

            def make(*args: Any, **kwargs: Any) -> Any:
                cfg = factory(*args, **kwargs)
                v = cfg.vision_config
                v.hidden_size, v.num_hidden_layers, v.num_attention_heads = vision.width, vision.depth, vision.num_heads
                v.patch_size = vision.patch_size
                return cfg

            return make

    def init(self: Any, vlm_config: Any, action_expert_config: Any, use_adarms: Any = None,
             precision: str = "bfloat16", image_size: int = 224, freeze_vision_encoder: bool = False,
             train_expert_only: bool = False) -> None:  # fmt: skip
        stock_init(self, vlm_config, action_expert_config, use_adarms, precision, image_size,
                   freeze_vision_encoder, train_expert_only)  # fmt: skip
        # the numbers LeRobot hard-codes for the released model, replaced; modules rebuilt by its classes
        pcfg = self.paligemma.config
        v = pcfg.vision_config
        v.intermediate_size, v.projection_dim, v.image_size = vision.mlp_dim, arch.vlm.width, vision.image_size
        pcfg.text_config.vocab_size = arch.vocab_size
        self.paligemma = type(self.paligemma)(config=pcfg)
        ecfg = self.gemma_expert.config
        ecfg.vocab_size = arch.vocab_size
        self.gemma_expert = type(self.gemma_expert)(config=ecfg)
        self.gemma_expert.model.embed_tokens = None
        self.to_bfloat16_for_selected_params(precision)
        self._set_requires_grad()

    m.get_gemma_config, m.CONFIG_MAPPING, m.PaliGemmaWithExpertModel.__init__ = get_gemma_config, _Mapping(), init
    try:
        yield
    finally:
        m.get_gemma_config, m.CONFIG_MAPPING, m.PaliGemmaWithExpertModel.__init__ = stock_get, stock_mapping, stock_init
