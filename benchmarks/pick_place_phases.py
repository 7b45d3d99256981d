"""Why does a tabletop policy fail pick_place? Each episode classified by the phase it failed in.

Why (issue 16): pick_place is the tabletop task that both SFT and RL fail, and a success rate does
not say where. This script runs held-out ``pick_place`` episodes (``reset(seed=seed + i)``) for each
``--ckpt`` (a policy folder, or ``expert`` for the scripted expert), records the per-step state,
object state and gripper command, and puts every episode into the first phase it did not get past:

  (a) never lifted the cube more than 2 cm above its rest height (the grasp failed);
  (b) lifted it but never carried it within 5 cm (xy) of the bowl centre (dropped or lost on the way);
  (c) carried it over the bowl but it ended outside the bowl's success radius (bad release);
  (d) ended inside the success radius but did not succeed (above the rim, or a finger still on it);
  (e) success.

At the first gripper close (the first step whose gripper command, action dim 6, is > 0) it measures the
end-effector to cube xy distance and height (mm), the yaw misalignment between the hand and the cube
(degrees, the cube's yaw taken modulo its quarter-turn symmetry) and the step index; the distributions
for the (a) episodes and the successes show whether grasps fail on position, height, yaw or timing. It
also reports, per phase, the fraction of steps with an undecided gripper (|command| < 0.5, before any
``--binarize-gripper``), and the success rate by the cube's starting |yaw| (0-15, 15-30, 30-45 deg).

Envs run in lockstep in this process; a policy is queried with one batched ``infer_batch`` for the
envs that need a new chunk, of which the first ``--replan`` actions are executed. A policy that reads a
camera (told by its input spec, as ``cosmos-robot eval`` decides) gets envs with ``obs_mode="all"`` and
images on the wire; a camera-free one gets ``obs_mode="state"`` (nothing is rendered).

    .venv/bin/python benchmarks/pick_place_phases.py --ckpt checkpoints/flow_tabletop_state_ppo --ckpt expert
    .venv/bin/python benchmarks/pick_place_phases.py --ckpt checkpoints/flow_tabletop --episodes 40 \\
        --binarize-gripper --out runs/pick_place_phases.json
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

os.environ.setdefault("MUJOCO_GL", "egl")

import numpy as np
import torch
from rich.console import Console
from rich.table import Table

from cosmos_robot_envs.eval.wire import TABLETOP_KEYS, WireMapping, reads_images, spec_from_metadata
from cosmos_robot_envs.progress import EpisodeBar
from cosmos_robot_envs.tabletop import TabletopEnv
from cosmos_robot_envs.tabletop.experts import scripted_expert
from cosmos_robot_envs.tabletop.rotations import axis_angle_to_quat, yaw_of
from cosmos_robot_envs.tabletop.task_logic import BOWL_SUCCESS_RADIUS

TASK = "pick_place"
EXPERT = "expert"
GRIPPER = 6  # action dim of the gripper command (-1 open, +1 close)
LIFT_M = 0.02  # cube z above its rest height that counts as lifted
OVER_BOWL_M = 0.05  # cube-bowl xy distance, while lifted, that counts as carried over the bowl
UNDECIDED = 0.5  # |gripper command| below this: an undecided gripper
QUARTER = np.pi / 2  # the cube's yaw symmetry
YAW_BINS_DEG = ((0.0, 15.0), (15.0, 30.0), (30.0, 45.0))
PHASES = {
    "a": "never lifted",
    "b": "lifted, never over bowl",
    "c": "over bowl, ended off it",
    "d": "ended in bowl, failed",
    "e": "success",
}
# first-close measures: key -> column header (xy, z: end-effector minus cube; yaw: hand vs cube mod 90 deg)
CLOSE_FIELDS = {"xy_mm": "xy mm", "dz_mm": "z mm", "yaw_deg": "yaw deg", "step": "step"}


# --------------------------------------------------------------------------------------- drivers
class ExpertDriver:
    """The scripted pick_place expert: closed loop, one action per step (``replan`` does not apply)."""

    cameras = False
    describe = "scripted expert, closed loop (one action per step)"

    def __init__(self) -> None:
        self.expert = scripted_expert(TASK)

    def reset(self) -> None:
        self.expert.reset()

    def chunks(self, obs: Sequence[dict[str, Any]]) -> list[np.ndarray]:
        return [self.expert.act(o)[None] for o in obs]


class PolicyDriver:
    """A policy folder queried in batches with wire observations (images only if it reads a camera)."""

    def __init__(self, ckpt: str, seed: int) -> None:
        from cosmos_robot.policies import load_policy_folder

        torch.manual_seed(seed)  # a policy that samples fresh noise repeats its draws
        self.policy = load_policy_folder(ckpt, device=torch.device("cpu"))
        metadata = getattr(self.policy, "metadata", {}) or {}
        spec = getattr(self.policy, "input_spec", None) or spec_from_metadata(metadata)
        self.cameras = reads_images(spec, TABLETOP_KEYS, ("image", "wrist_image"))
        self.wire = WireMapping(TABLETOP_KEYS, spec)  # drops object_state for a policy that does not declare it
        wire_keys = [k for k in TABLETOP_KEYS.values() if spec is None or spec.allow_extra or k in spec.fields]
        env_mode = "obs_mode='all' (renders cameras)" if self.cameras else "obs_mode='state' (renders nothing)"
        self.describe = f"{env_mode}, sends {', '.join(wire_keys)}"

    def reset(self) -> None:
        if hasattr(self.policy, "reset"):
            self.policy.reset()

    def chunks(self, obs: Sequence[dict[str, Any]]) -> list[np.ndarray]:
        wire = [self.wire(o) for o in obs]
        if hasattr(self.policy, "infer_batch"):
            out = self.policy.infer_batch(wire)
        else:
            out = [self.policy.infer(w) for w in wire]
        return [np.atleast_2d(np.asarray(r["actions"], dtype=np.float64)) for r in out]


Driver = ExpertDriver | PolicyDriver


def make_driver(ckpt: str, seed: int) -> Driver:
    return ExpertDriver() if ckpt == EXPERT else PolicyDriver(ckpt, seed)


# --------------------------------------------------------------------------------------- rollout
@dataclass
class Trace:
    """One episode: ``state[k]`` / ``obj[k]`` are the observation the k-th action was chosen from."""

    seed: int
    state: list[np.ndarray] = field(default_factory=list)
    obj: list[np.ndarray] = field(default_factory=list)
    grip: list[float] = field(default_factory=list)  # the commanded gripper, clipped, before binarizing
    success: bool = False
    length: int = 0
    max_steps: int = 0

    def observe(self, obs: dict[str, Any]) -> None:
        self.state.append(np.asarray(obs["state"], dtype=np.float64))
        self.obj.append(np.asarray(obs["object_state"], dtype=np.float64))


def run_wave(
    driver: Driver,
    envs: list[TabletopEnv],
    seeds: list[int],
    replan: int,
    binarize: bool,
    on_done: Callable[[bool], None],
) -> list[Trace]:
    """Episodes ``seeds`` (one per env) in lockstep until each terminates or truncates."""
    traces = [Trace(seed) for seed in seeds]
    obs: list[dict[str, Any]] = []
    for env, trace in zip(envs, traces):
        o, _ = env.reset(seed=trace.seed)
        trace.observe(o)
        trace.max_steps = env.max_steps
        obs.append(o)
    queue = [np.zeros((0, GRIPPER + 1))] * len(seeds)  # empty: query the policy on the first step
    pos = [0] * len(seeds)
    live = list(range(len(seeds)))
    while live:
        need = [i for i in live if pos[i] >= min(replan, len(queue[i]))]
        for i, chunk in zip(need, driver.chunks([obs[i] for i in need])):
            queue[i], pos[i] = chunk, 0
        for i in list(live):
            action = np.clip(queue[i][pos[i]], -1.0, 1.0)
            pos[i] += 1
            traces[i].grip.append(float(action[GRIPPER]))
            if binarize:
                action[GRIPPER] = 1.0 if action[GRIPPER] > 0 else -1.0
            obs[i], _, terminated, truncated, info = envs[i].step(action)
            traces[i].length += 1
            if terminated or truncated:
                traces[i].success = bool(info["is_success"])
                live.remove(i)
                on_done(traces[i].success)
            else:
                traces[i].observe(obs[i])
    return traces


def rollout(driver: Driver, args: argparse.Namespace, label: str) -> tuple[list[Trace], float]:
    """All ``args.episodes`` episodes, ``args.num_envs`` at a time; also the wall time (s)."""
    obs_mode = "all" if driver.cameras else "state"  # object_state is needed for the phases either way
    n_envs = max(1, min(args.num_envs, args.episodes))
    envs = [TabletopEnv(TASK, obs_mode=obs_mode, image_size=args.image_size) for _ in range(n_envs)]
    traces: list[Trace] = []
    successes: list[bool] = []
    t0 = time.perf_counter()
    try:
        driver.reset()
        with EpisodeBar(label, "success {task.fields[success]}") as bar:
            bar.start(args.episodes, success=0)

            def on_done(success: bool) -> None:
                successes.append(success)
                bar.advance(success=sum(successes))

            for start in range(0, args.episodes, n_envs):
                seeds = [args.seed + i for i in range(start, min(start + n_envs, args.episodes))]
                traces += run_wave(driver, envs[: len(seeds)], seeds, args.replan, args.binarize_gripper, on_done)
    finally:
        for env in envs:
            env.close()
    return traces, time.perf_counter() - t0


# --------------------------------------------------------------------------------------- analysis
@dataclass
class Episode:
    seed: int
    phase: str
    success: bool
    length: int
    timed_out: bool
    start_yaw_deg: float  # the cube's starting |yaw|
    undecided_frac: float  # fraction of steps with |gripper command| < UNDECIDED
    first_close: dict[str, float] | None  # CLOSE_FIELDS at the first close; None if it never closed


def quarter_wrap(angle: float) -> float:
    """``angle`` (radians) modulo the cube's quarter-turn symmetry, in [-pi/4, pi/4)."""
    return float((angle + QUARTER / 2) % QUARTER - QUARTER / 2)


def phase_of(obj: np.ndarray, success: bool) -> str:
    """The first phase (``PHASES``) the episode did not get past, from its object states ``(T, 15)``."""
    cube, bowl = obj[:, 0:3], obj[0, 7:10]
    lifted = cube[:, 2] > cube[0, 2] + LIFT_M
    to_bowl = np.linalg.norm(cube[:, :2] - bowl[:2], axis=1)
    if success:
        return "e"
    if not lifted.any():
        return "a"
    if not (lifted & (to_bowl < OVER_BOWL_M)).any():
        return "b"
    return "c" if to_bowl[-1] >= BOWL_SUCCESS_RADIUS else "d"


def first_close(state: np.ndarray, obj: np.ndarray, grip: np.ndarray) -> dict[str, float] | None:
    """Hand-cube geometry at the first step whose gripper command is > 0 (from that step's observation)."""
    closing = np.flatnonzero(grip > 0)
    if not closing.size:
        return None
    k = int(closing[0])
    eef, cube = state[k, :3], obj[k, :3]
    misalign = quarter_wrap(yaw_of(obj[k, 3:7]) - yaw_of(axis_angle_to_quat(state[k, 3:6])))
    return {
        "xy_mm": float(np.linalg.norm(eef[:2] - cube[:2]) * 1000),
        "dz_mm": float((eef[2] - cube[2]) * 1000),
        "yaw_deg": float(np.degrees(abs(misalign))),
        "step": float(k),
    }


def classify(trace: Trace) -> Episode:
    state, obj, grip = np.array(trace.state), np.array(trace.obj), np.array(trace.grip)
    return Episode(
        seed=trace.seed,
        phase=phase_of(obj, trace.success),
        success=trace.success,
        length=trace.length,
        timed_out=not trace.success and trace.length >= trace.max_steps,
        start_yaw_deg=float(np.degrees(abs(yaw_of(obj[0, 3:7])))),
        undecided_frac=float(np.mean(np.abs(grip) < UNDECIDED)) if grip.size else 0.0,
        first_close=first_close(state, obj, grip),
    )


def yaw_bin(deg: float) -> int:
    """Index into ``YAW_BINS_DEG`` (a start yaw at or past the last edge falls in the last bin)."""
    return next((i for i, (_, hi) in enumerate(YAW_BINS_DEG) if deg < hi), len(YAW_BINS_DEG) - 1)


def percentiles(values: Sequence[float]) -> dict[str, float] | None:
    if not values:
        return None
    p10, p50, p90 = np.percentile(np.asarray(values, dtype=np.float64), (10, 50, 90))
    return {"p10": float(p10), "p50": float(p50), "p90": float(p90)}


def close_stats(episodes: Sequence[Episode]) -> dict[str, Any]:
    closed = [e.first_close for e in episodes if e.first_close is not None]
    return {
        "episodes": len(episodes),
        "closed": len(closed),
        **{k: percentiles([c[k] for c in closed]) for k in CLOSE_FIELDS},
    }


def summarize(ckpt: str, episodes: list[Episode], wall_s: float) -> dict[str, Any]:
    """The per-policy summary (what ``--out`` writes), episodes included."""
    n = len(episodes)
    by_phase = {p: [e for e in episodes if e.phase == p] for p in PHASES}
    yaw_bins = {f"{lo:.0f}-{hi:.0f}": {"episodes": 0, "successes": 0} for lo, hi in YAW_BINS_DEG}
    for e in episodes:
        row = yaw_bins[list(yaw_bins)[yaw_bin(e.start_yaw_deg)]]
        row["episodes"] += 1
        row["successes"] += int(e.success)
    return {
        "ckpt": ckpt,
        "episodes": n,
        "success_rate": sum(e.success for e in episodes) / max(n, 1),
        "wall_s": round(wall_s, 1),
        "phases": {
            p: {
                "label": PHASES[p],
                "count": len(eps),
                "fraction": len(eps) / max(n, 1),
                "timed_out": sum(e.timed_out for e in eps),
                "mean_length": float(np.mean([e.length for e in eps])) if eps else None,
                "undecided_gripper_frac": float(np.mean([e.undecided_frac for e in eps])) if eps else None,
                "first_close": close_stats(eps),
            }
            for p, eps in by_phase.items()
        },
        "success_by_start_yaw_deg": yaw_bins,
        "per_episode": [asdict(e) for e in episodes],
    }


# --------------------------------------------------------------------------------------- report
def _num(value: float | None, fmt: str = ".0f") -> str:
    return "-" if value is None else format(value, fmt)


def phase_table(summary: dict[str, Any]) -> Table:
    table = Table(title=f"{summary['ckpt']}: {summary['episodes']} episodes, success {summary['success_rate']:.1%}")
    table.add_column("phase", no_wrap=True)
    for name in ("n", "%", "timed out", "mean len", "|grip|<0.5"):
        table.add_column(name, justify="right")
    for p, row in summary["phases"].items():
        table.add_row(
            f"({p}) {row['label']}",
            str(row["count"]),
            f"{100 * row['fraction']:.1f}",
            str(row["timed_out"]),
            _num(row["mean_length"]),
            _num(row["undecided_gripper_frac"], ".3f"),
        )
    return table


def close_table(summary: dict[str, Any]) -> Table:
    table = Table(title="at the first gripper close: p10/p50/p90")
    table.add_column("phase", no_wrap=True)
    table.add_column("closed", justify="right")
    for label in CLOSE_FIELDS.values():
        table.add_column(label, justify="right")
    for p in ("a", "e"):
        stats = summary["phases"][p]["first_close"]
        cells = []
        for key in CLOSE_FIELDS:
            q = stats[key]
            cells.append("-" if q is None else "/".join(str(round(q[k])) for k in ("p10", "p50", "p90")))
        table.add_row(f"({p}) {PHASES[p]}", f"{stats['closed']}/{stats['episodes']}", *cells)
    table.caption = "xy, z: eef minus cube; yaw: hand vs cube, mod 90; closed: gripper command ever > 0"
    return table


def yaw_table(summary: dict[str, Any]) -> Table:
    table = Table(title="success by the cube's starting |yaw|")
    for name in ("|yaw| (deg)", "episodes", "successes", "success"):
        table.add_column(name, justify="right")
    for label, row in summary["success_by_start_yaw_deg"].items():
        n, k = row["episodes"], row["successes"]
        table.add_row(label, str(n), str(k), f"{100 * k / n:.1f}%" if n else "-")
    return table


def report(console: Console, summary: dict[str, Any]) -> None:
    console.print(phase_table(summary))
    console.print(close_table(summary))
    console.print(yaw_table(summary))
    console.print(f"wall {summary['wall_s']:.1f} s\n")


# --------------------------------------------------------------------------------------- main
def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], epilog=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--ckpt",
        action="append",
        required=True,
        help=f"policy folder, or '{EXPERT}' for the scripted expert (repeatable)",
    )
    parser.add_argument("--episodes", type=int, default=100, help="pick_place episodes per policy")
    parser.add_argument("--seed", type=int, default=1000, help="episode i resets with seed + i (eval-style, held out)")
    parser.add_argument("--replan", type=int, default=5, help="actions executed from each chunk before re-querying")
    parser.add_argument("--binarize-gripper", action="store_true", help="execute the sign of the gripper command")
    parser.add_argument("--num-envs", type=int, default=50, help="envs stepped in lockstep (episodes run in waves)")
    parser.add_argument("--image-size", type=int, default=128, help="camera side for image policies (as eval renders)")
    parser.add_argument("--out", type=Path, help="write the per-policy summaries (and per-episode rows) as JSON")
    args = parser.parse_args()
    for name in ("episodes", "replan", "num_envs"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')}: expected a positive int, got {getattr(args, name)}")
    return args


def main() -> None:
    args = parse_args()
    # one thread: the envs step in this same process, so extra torch threads would only contend with
    # MuJoCo (and the box is small); batched inference over the live envs is where the speed comes from
    torch.set_num_threads(1)
    console = Console()
    summaries = []
    for ckpt in args.ckpt:
        driver = make_driver(ckpt, args.seed)
        plan = "" if isinstance(driver, ExpertDriver) else f", replan {args.replan}"
        grip = ", gripper binarized" if args.binarize_gripper else ""
        console.print(f"[bold]{ckpt}[/bold]: {driver.describe}{plan}{grip}", highlight=False, soft_wrap=True)
        traces, wall_s = rollout(driver, args, Path(ckpt).name)
        summary = summarize(ckpt, [classify(t) for t in traces], wall_s)
        report(console, summary)
        summaries.append(summary)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        settings = {k: vars(args)[k] for k in ("episodes", "seed", "replan", "binarize_gripper", "image_size")}
        args.out.write_text(json.dumps({"settings": settings, "policies": summaries}, indent=2) + "\n")
        console.print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
