"""The untrained baseline for a GR00T SFT result: the same folder with the init's action head put back.

Why a twin: "SFT beats the untrained model" must compare like with like. The SFT result's folder
carries processors normalised with the data's statistics for ``new_embodiment``; the init's own folder
(``runs/tiny/groot/policy``) carries other statistics, so evaluating it would measure the statistics
too. The twin is the SFT folder with every tensor the training changed (the action head) replaced by
the init's, and a fresh manifest: the one difference between the two folders is the training.

    python benchmarks/groot_untrained_twin.py --trained runs/sft_groot_tabletop/final \
        --init runs/tiny/groot/policy --out runs/groot_untrained_twin
    cosmos-robot eval --ckpt runs/groot_untrained_twin --episodes-per-task 100 --seed 1000 ...
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

from safetensors.torch import load_file, save_file

from cosmos_robot.manifest import MANIFEST_FILE, write_manifest

WEIGHTS = "model.safetensors"


def untrained_twin(trained: Path, init: Path, out: Path) -> list[str]:
    """Write the twin to ``out``; returns the keys that took the init's values (all in the action head)."""
    ours, theirs = load_file(str(trained / WEIGHTS)), load_file(str(init / WEIGHTS))
    if ours.keys() != theirs.keys():
        missing = sorted(ours.keys() ^ theirs.keys())[:5]
        raise ValueError(f"{trained} and {init} hold different tensors (e.g. {missing}): not the same model")
    changed = [k for k in ours if not (ours[k].shape == theirs[k].shape and bool((ours[k] == theirs[k]).all()))]
    outside = [k for k in changed if ".action_head." not in k]
    if outside:
        raise ValueError(f"{trained} differs from {init} outside the action head ({outside[:3]}): not an SFT result")
    if out.exists():
        shutil.rmtree(out)
    shutil.copytree(trained, out, ignore=shutil.ignore_patterns(MANIFEST_FILE))
    save_file({k: theirs[k] if k in changed else ours[k] for k in ours}, str(out / WEIGHTS), metadata={"format": "pt"})
    write_manifest(out, {"family": "groot", "target": "policy", "source": f"untrained twin of {trained} ({init})"})
    return changed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trained", type=Path, required=True, help="the SFT run's final/ folder")
    parser.add_argument("--init", type=Path, required=True, help="the policy folder the SFT started from")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    changed = untrained_twin(args.trained, args.init, args.out)
    print(f"{args.out}: {len(changed)} action-head tensors from {args.init}, the rest from {args.trained}")


if __name__ == "__main__":
    main()
