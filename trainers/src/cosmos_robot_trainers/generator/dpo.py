"""``generator_dpo``: Diffusion-DPO (Flow-DPO) of a Cosmos3 generator on (winner, loser) pairs.

Pairs of the same prompt come from a preference JSONL (``{"prompt", "chosen", "rejected"}`` with image
paths; cosmos-framework's ``dpo_t2i_public`` reads such files) or are ranked by the reward among
``group_size`` deterministic samples of the initial model per prompt (the best against the worst;
ties dropped), the offline synthetic pairs of a smoke run made meaningful by a real reward. Both
members of a pair are noised with the same ``(sigma, eps)``; the loss is ``flow_dpo`` (Diffusion-DPO's
``-log sigma(-beta/2 [(e_w - e_ref_w) - (e_l - e_ref_l)])`` on velocity errors) against the frozen initial
model: with LoRA the same transformer with its adapters disabled, else a frozen copy.

Validation is cosmos-framework's: the implicit accuracy on held-out pairs (prompts never trained on),
each pair scored under ``noise_draws`` fixed ``(sigma, eps)`` draws, a tie counting one half (so exactly
0.5 at initialisation), beside the held-out mean reward of generations.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from cosmos_robot.distributed import barrier, mean_over_ranks
from cosmos_robot_trainers.algorithms import get as get_algorithm
from cosmos_robot_trainers.algorithms.losses import flow_dpo_logits
from cosmos_robot_trainers.common import EpochBatchSampler
from cosmos_robot_trainers.generator.config import GenDPOConfig
from cosmos_robot_trainers.generator.flow import draw_sigmas, noised, optimizer_step, prompt_ids
from cosmos_robot_trainers.generator.run import GenResult, GenRun

__all__ = ["Pairs", "implicit_accuracy", "run_generator_dpo"]

PAIRS_FILE = "pairs.safetensors"


class Pairs:
    """Winner and loser latents ``(P, C, T, h, w)`` with their prompts and reward margins."""

    def __init__(self, chosen: torch.Tensor, rejected: torch.Tensor, prompts: list[str], margin: torch.Tensor) -> None:
        self.chosen, self.rejected, self.prompts, self.margin = chosen, rejected, prompts, margin

    def __len__(self) -> int:
        return len(self.prompts)

    def save(self, path: Path) -> None:
        tensors = {"chosen": self.chosen, "rejected": self.rejected, "margin": self.margin}
        save_file(
            {k: v.contiguous() for k, v in tensors.items()}, str(path), metadata={"prompts": json.dumps(self.prompts)}
        )

    @classmethod
    def load(cls, path: Path) -> Pairs:
        from safetensors import safe_open

        with safe_open(str(path), "pt") as fh:
            prompts = json.loads(fh.metadata()["prompts"])
        t = load_file(str(path))
        return cls(t["chosen"], t["rejected"], prompts, t["margin"])


def ranked_pairs(run: GenRun, prompts: list[str], group: int, seed: int, min_margin: float = 0.0) -> Pairs:
    """Best-vs-worst pairs among ``group`` samples of the current model per prompt; pairs whose reward
    margin is 0 or below ``min_margin`` are dropped."""
    chosen, rejected, kept, margins = [], [], [], []
    for i, prompt in enumerate(prompts):
        seeds = [seed * 7919 + i * group + k for k in range(group)]
        lat = run.generate([prompt] * group, seeds)
        scores = np.asarray(run.reward(run.images(lat), [prompt] * group), np.float64)
        best, worst = int(scores.argmax()), int(scores.argmin())
        if scores[best] > scores[worst] and scores[best] - scores[worst] >= min_margin:
            chosen.append(lat[best].cpu())
            rejected.append(lat[worst].cpu())
            kept.append(prompt)
            margins.append(float(scores[best] - scores[worst]))
    if not kept:
        raise ValueError(
            f"no pairs: no group of {group} samples differs by more than algo.min_margin={min_margin} in "
            f"reward {run.config.reward.name!r}"
        )
    return Pairs(torch.stack(chosen), torch.stack(rejected), kept, torch.tensor(margins))


def jsonl_pairs(run: GenRun, path: str) -> Pairs:
    """Pairs of a preference JSONL; image paths are relative to the file; errors name the line."""
    from PIL import Image

    file = Path(path)
    if not file.is_file():
        raise ValueError(f"algo.data_path: {file} does not exist")
    shape = run.shape
    media: dict[str, list[np.ndarray]] = {"chosen": [], "rejected": []}
    prompts = []
    for n, line in enumerate(file.read_text().splitlines(), 1):
        if not line.strip():
            continue
        where = f"{file}:{n}"
        row = json.loads(line)
        if not isinstance(row, dict) or not all(isinstance(row.get(k), str) for k in ("prompt", "chosen", "rejected")):
            raise ValueError(f"{where}: a pair is {{'prompt': str, 'chosen': image path, 'rejected': image path}}")
        for key in ("chosen", "rejected"):
            img_path = (file.parent / row[key]).resolve()
            if not img_path.is_file():
                raise ValueError(f"{where}: {key} image {img_path} does not exist")
            with Image.open(img_path) as img:
                arr = np.asarray(img.convert("RGB"))
            if arr.shape[:2] != (shape.height, shape.width):
                raise ValueError(f"{where}: {key} is {arr.shape[1]}x{arr.shape[0]}, the recipe's shape is "
                                 f"{shape.width}x{shape.height}")  # fmt: skip
            media[key].append(arr[None])
        prompts.append(row["prompt"])
    if not prompts:
        raise ValueError(f"algo.data_path: {file} holds no pairs")
    enc = {}
    with torch.no_grad():
        for key, arrs in media.items():
            px = torch.from_numpy(np.stack(arrs)).permute(0, 4, 1, 2, 3).float() / 127.5 - 1.0
            enc[key] = torch.cat([run.gen.encode(px[i : i + 64]).cpu() for i in range(0, len(px), 64)])
    return Pairs(enc["chosen"], enc["rejected"], prompts, torch.ones(len(prompts)))


@contextmanager
def reference(run: GenRun, frozen: Any) -> Iterator[Any]:
    """The reference transformer: LoRA's base (adapters disabled) or the frozen copy."""
    if frozen is not None:
        yield frozen
        return
    tr = run.gen.transformer
    tr.disable_adapters()
    try:
        yield tr
    finally:
        tr.enable_adapters()


def pair_logits(
    run: GenRun,
    frozen: Any,
    pairs: Pairs,
    idx: np.ndarray,
    gen: torch.Generator,
    ids_cache: dict,
    rows: slice | None = None,
) -> Any:
    """``(loss, metrics, logits)`` of ``flow_dpo`` on pairs ``idx``; w and l share one ``(sigma, eps)`` draw.
    ``rows``: the part of ``idx`` computed here (a data-parallel rank's share; the draws are made for all)."""
    win, lose = pairs.chosen[idx].to(run.gen.device), pairs.rejected[idx].to(run.gen.device)
    eps = torch.randn(win.shape, generator=gen).to(win)
    sig = draw_sigmas(len(idx), gen, run.config.train.timestep_sampling)
    if rows is not None:
        idx, win, lose, eps, sig = idx[rows], win[rows], lose[rows], eps[rows], sig[rows]
    xw, tw = noised(win, eps, sig)
    xl, tl = noised(lose, eps, sig)
    ids = prompt_ids(run.gen, [pairs.prompts[i] for i in idx], run.shape, ids_cache)
    vw = run.gen.velocities(xw, sig, ids, run.shape)
    vl = run.gen.velocities(xl, sig, ids, run.shape)
    with torch.no_grad(), reference(run, frozen) as ref, run.gen.using(ref):
        rw = run.gen.velocities(xw, sig, ids, run.shape)
        rl = run.gen.velocities(xl, sig, ids, run.shape)
    beta = run.config.algo.beta
    loss, metrics = get_algorithm("loss", "flow_dpo")(vw, rw, tw, vl, rl, tl, beta=beta)
    logit, _ = flow_dpo_logits(vw.detach(), rw, tw, vl.detach(), rl, tl, beta=beta)
    return loss, metrics, logit


@torch.no_grad()
def implicit_accuracy(run: GenRun, frozen: Any, pairs: Pairs, draws: int, ids_cache: dict) -> dict[str, float]:
    """Held-out implicit accuracy (ties count 1/2) and mean loss over ``draws`` fixed noise draws per pair."""
    logits = torch.zeros(len(pairs))
    losses = []
    for d in range(draws):
        g = torch.Generator().manual_seed(10_007 + d)
        for start in range(0, len(pairs), 16):
            idx = np.arange(start, min(start + 16, len(pairs)))
            loss, _, logit = pair_logits(run, frozen, pairs, idx, g, ids_cache)
            logits[idx] += logit.cpu() / draws
            losses.append(float(loss) * len(idx))
    acc = ((logits > 0).float() + 0.5 * (logits == 0).float()).mean()
    return {"heldout_implicit_acc": float(acc), "heldout_dpo_loss": sum(losses) / (len(pairs) * draws)}


def _pairs(run: GenRun, config: GenDPOConfig, log: Callable[[str], None]) -> tuple[Pairs, Pairs]:
    """Training and held-out pairs, made once per run folder and reused on resume."""
    train_file, held_file = run.out / PAIRS_FILE, run.out / f"heldout_{PAIRS_FILE}"
    if train_file.exists() and held_file.exists():
        return Pairs.load(train_file), Pairs.load(held_file)
    a = config.algo
    if a.pairs == "jsonl":
        assert a.data_path is not None
        every = jsonl_pairs(run, a.data_path)
        n_held = min(a.heldout_pairs, len(every) - 1)
        if n_held < 1:
            raise ValueError(f"algo.data_path: {a.data_path} needs at least 2 pairs (training and held out)")
        cut = len(every) - n_held
        train = Pairs(every.chosen[:cut], every.rejected[:cut], every.prompts[:cut], every.margin[:cut])
        held = Pairs(every.chosen[cut:], every.rejected[cut:], every.prompts[cut:], every.margin[cut:])
    else:
        log(f"ranking {a.group_size} samples of the initial model for {len(run.prompts)} + {a.heldout_pairs} prompts")
        train = ranked_pairs(run, run.prompts, a.group_size, config.train.seed, a.min_margin)
        from cosmos_robot_trainers.generator.prompts import heldout_prompts

        held_prompts = heldout_prompts(config.prompts, a.heldout_pairs)
        held = ranked_pairs(run, held_prompts, a.group_size, 10**6 + config.train.seed, a.min_margin)
    train.save(train_file)
    held.save(held_file)
    log(f"pairs: {len(train)} training, {len(held)} held out; mean reward margin {float(train.margin.mean()):.4f}")
    return train, held


def run_generator_dpo(
    config: GenDPOConfig, *, resume: bool, overwrite: bool, log: Callable[[str], None], stop_at_step: int | None = None
) -> GenResult:
    run = GenRun(config, resume=resume, overwrite=overwrite, log=log)
    frozen = None
    if config.lora.rank == 0:
        frozen = run.initial_copy()
    made = None
    if run.world.is_main:  # rank 0 ranks / encodes them into the run folder (FSDP: on its whole copy)
        with run.whole():
            made = _pairs(run, config, run.log)
    barrier(run.world)  # the others read them there
    train, held = made if made is not None else _pairs(run, config, run.log)
    sampler = EpochBatchSampler(len(train), config.train.batch_size, config.train.seed)
    run.restore(lambda extra: sampler.load_state_dict(extra["sampler"]))
    ids_cache: dict[str, list[int]] = {}

    def step(_: int) -> dict[str, float]:
        idx = sampler.next_indices()
        rows, weight = run.share(len(idx))
        loss, m, _ = pair_logits(run, frozen, train, idx, run.generator, ids_cache, rows)
        norm = optimizer_step(run, loss, weight)
        out = {k: mean_over_ranks(float(v) * weight, run.world) for k, v in {"loss": float(loss.detach()), **m}.items()}
        return {**out, "grad_norm": norm}

    return run.loop(
        step,
        stop_at_step=stop_at_step,
        extra_state=lambda: {"sampler": sampler.state_dict()},
        extra_eval=lambda: implicit_accuracy(run, frozen, held, config.algo.noise_draws, ids_cache),
    )
