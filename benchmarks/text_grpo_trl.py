"""GRPO step time side by side with TRL 1.16's GRPOTrainer, same model, batch and settings, one run.

Issue 17's GPU comparison: a random bf16 model shaped like Qwen3-0.6B (28 layers, hidden 1024, 16 / 8
heads, vocabulary 151,936; the tokenizer is the character tokenizer padded to that vocabulary, the
stand-in for Qwen's, which is not available offline), 16 prompts x 8 completions of up to 256 tokens
at temperature 1, one optimizer step per generation batch, loss "grpo" (sequence mean of token
means), no KL, AdamW lr 1e-6, no gradient checkpointing. Each side runs in its own process (clean
peak memory) for ``--steps`` steps; the first is warm-up (compilation, CUDA graph capture), the rest
are reported as the median.

- **ours**: ``cosmos-robot``'s ``text_grpo`` trainer (``run_text_grpo``) with each ``--engine`` named:
  ``transformers_static`` (one padded ``generate`` with a compiled static KV cache), ``vllm`` (vLLM
  colocated in the process, ``--vllm-memory`` of the GPU, weights synced in place after each update)
  or ``transformers`` (continuous batching); one update per batch, so the "old" log-probs are the
  update's own (no scoring pass, as TRL with ``num_iterations = 1``);
- **trl**: ``GRPOTrainer`` on its default path (``use_vllm=False``: ``model.generate``), timed from
  ``on_step_begin`` to ``on_step_end`` (generation happens inside its step), its ``generate`` timed
  by wrapping the model's method.

``--size qwen3-vl-2b`` times the image-text path (issue 18): a random bf16 model shaped like Qwen3-VL-2B
(text tower 28 layers, hidden 2048, 16 / 8 heads; vision tower 24 blocks, hidden 1024, deepstack at 5, 11,
17) on ``shapes/mixed`` prompts, each with one image resized to 256 x 256 pixels (64 image tokens), sampled
by ``transformers_static`` with the images; TRL is not run beside it.

``--trainer ppo`` / ``opd`` time our token PPO (critic and reference included) or on-policy
distillation (a same-size teacher) on the same batch, without TRL (which has neither in 1.16); their
MFU counts the policy's FLOPs only.

MFU counts the same model FLOPs for both (2 N per sampled or prompt token, 6 N per trained token;
N = all parameters, the tied head included once) over the step time and the H200's 989 TFLOP/s
dense bf16. Usage (on the GPU machine; TRL and datasets carried as wheels):

    python benchmarks/text_grpo_trl.py --engine vllm transformers_static --micro-batch 32  # prints a table
    python benchmarks/text_grpo_trl.py --size tiny --device cpu --steps 2  # a smoke run on a CPU
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

SIZES = {
    "qwen3-0.6b": {"hidden": 1024, "layers": 28, "heads": 16, "kv_heads": 8, "intermediate": 3072, "head_dim": 128},
    "tiny": {"hidden": 64, "layers": 2, "heads": 4, "kv_heads": 2, "intermediate": 128, "head_dim": 16},
    "qwen3-vl-2b": {"hidden": 2048, "layers": 28, "heads": 16, "kv_heads": 8, "intermediate": 6144, "head_dim": 128},
    "tiny-vl": {"hidden": 64, "layers": 2, "heads": 4, "kv_heads": 2, "intermediate": 128, "head_dim": 16},
}
VOCAB = {"qwen3-0.6b": 151_936, "tiny": 1_000, "qwen3-vl-2b": 151_936, "tiny-vl": 1_000}
# image-text sizes: the vision tower (Qwen3-VL-2B's: 24 blocks of width 1024, deepstack at 5, 11, 17) and image side
VISION = {
    "qwen3-vl-2b": {
        "depth": 24,
        "hidden_size": 1024,
        "intermediate_size": 4096,
        "num_heads": 16,
        "deep": [5, 11, 17],
        "mrope_section": [24, 20, 20],
        "positions": 2304,
    },
    "tiny-vl": {
        "depth": 2,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_heads": 4,
        "deep": [1],
        "mrope_section": [4, 2, 2],
        "positions": 64,
    },
}
IMAGE_SIDE = {"qwen3-vl-2b": 256, "tiny-vl": 64}


def task_of(size: str) -> str:
    return "shapes/mixed" if size in VISION else "addition"


PEAK_TFLOPS = 989.0  # H200 dense bf16


def bench_reward(text: str) -> float:
    """A deterministic reward that differs within groups (so advantages are not all zero): chars mod 7."""
    return float(len(text) % 7)


def build_vl_model(size: str, out: Path) -> Path:
    """A random bf16 Qwen3-VL of ``size`` with the character tokenizer padded to Qwen's vocabulary."""
    import torch

    from cosmos_robot.text.hf import CausalLM, save_causal_lm
    from cosmos_robot.text.tiny import tiny_qwen3_vl, vl_tokenizer
    from cosmos_robot.text.vision import image_processor

    s, v = SIZES[size], VISION[size]
    tok = vl_tokenizer("printable", vocab_size=VOCAB[size])
    model = tiny_qwen3_vl(
        tok,
        hidden=s["hidden"],
        layers=s["layers"],
        heads=s["heads"],
        kv_heads=s["kv_heads"],
        intermediate=s["intermediate"],
        head_dim=s["head_dim"],
        max_positions=4096,
        mrope_section=v["mrope_section"],
        rope_theta=5_000_000.0,
        vision_hidden=v["hidden_size"],
        vision_depth=v["depth"],
        vision_heads=v["num_heads"],
        vision_intermediate=v["intermediate_size"],
        deepstack=v["deep"],
        vision_positions=v["positions"],
    ).to(torch.bfloat16)
    return save_causal_lm(CausalLM(model, tok, None, image_processor(IMAGE_SIDE[size])), out)


def build_model(size: str, out: Path) -> Path:
    import torch

    if size in VISION:
        return build_vl_model(size, out)
    from transformers import AutoConfig, AutoModelForCausalLM

    from cosmos_robot.text.hf import CausalLM, save_causal_lm
    from cosmos_robot.text.tiny import char_tokenizer

    s = SIZES[size]
    tok = char_tokenizer("arithmetic", vocab_size=VOCAB[size])
    config = AutoConfig.for_model(
        "qwen3",
        vocab_size=len(tok),
        hidden_size=s["hidden"],
        intermediate_size=s["intermediate"],
        num_hidden_layers=s["layers"],
        num_attention_heads=s["heads"],
        num_key_value_heads=s["kv_heads"],
        head_dim=s["head_dim"],
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        rope_theta=1_000_000.0,
        bos_token_id=None,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.pad_token_id = tok.pad_token_id
    return save_causal_lm(CausalLM(model, tok, None), out)


def prompt_tokens_of(lm: Any, size: str, n: int) -> int:
    """Tokens (image tokens included) of the first ``n`` train prompts of the size's task."""
    from cosmos_robot.text.tasks import task_examples
    from cosmos_robot.text.vision import example_prompt

    examples = task_examples(task_of(size), "train", n, seed=0)
    return sum(len(example_prompt(lm.tokenizer, lm.processor, ex)[0]) for ex in examples)


def _trainer_tables(args: argparse.Namespace, folder: Path) -> tuple[Any, Any, dict[str, Any]]:
    """(config class, run function, trainer-specific tables) of ``--trainer``."""
    if args.trainer == "ppo":
        from cosmos_robot_trainers.text.config import TextPPOConfig
        from cosmos_robot_trainers.text.ppo import run_text_ppo

        # verl's PPO defaults (ppo_qwen3_gsm8k): KL 0.001 in the reward (a reference model), GAE lambda 1
        tables = {"algo": {"kl_coef": 0.001, "gamma": 1.0, "lam": 1.0}, "critic": {"lr": 1e-5}}
        return TextPPOConfig, run_text_ppo, tables
    if args.trainer == "opd":
        from cosmos_robot_trainers.text.config import TextOPDConfig
        from cosmos_robot_trainers.text.opd import run_text_opd

        # the teacher is the same folder: the timing of a same-size teacher's full-vocabulary scoring
        return TextOPDConfig, run_text_opd, {"teacher": {"init": str(folder)}, "algo": {"loss": "jsd"}}
    from cosmos_robot_trainers.text.config import TextGRPOConfig
    from cosmos_robot_trainers.text.grpo import run_text_grpo

    tables = {"algo": {"advantage": "grpo", "loss_agg": "seq_mean_token_mean", "filter_groups": False}}
    return TextGRPOConfig, run_text_grpo, tables


def run_ours(args: argparse.Namespace, folder: Path, work: Path) -> dict[str, Any]:
    import torch

    from cosmos_robot.text import rewards

    rewards.REWARDS["bench_chars"] = lambda text, example: bench_reward(text)
    config_cls, run, tables = _trainer_tables(args, folder)
    config = config_cls.model_validate(
        {
            "init": str(folder),
            "data": {"task": task_of(args.size)},
            "rollout": {
                "engine": args.engine[0],
                "prompts_per_iter": args.prompts,
                "group_size": args.group,
                "max_new_tokens": args.max_new_tokens,
                "temperature": 1.0,
                "vllm": {"gpu_memory_utilization": args.vllm_memory},
            },
            "reward": {"name": "bench_chars"},
            "optim": {
                "lr": 1e-6,
                "warmup_steps": 0,
                "schedule": "constant",
                "weight_decay": 0.0,
                "epochs": 1,
                "minibatch_size": args.prompts * args.group,
                "micro_batch_size": args.micro_batch,
            },
            "train": {
                "steps": args.steps + 1,  # stopped after args.steps (below): no checkpoint or final/ written
                "ckpt_every": 10_000,
                "device": args.device,
                "dtype": args.dtype,
                "num_threads": None,
                "deterministic": False,
                "progress": False,
            },
            "eval": {"final": False},
            "output": {"dir": str(work / "ours"), "tensorboard": False},
            **tables,
        }
    )
    if args.device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    # a 2B model's checkpoint with two AdamW states is ~57 GB: more than the GPU machine's free disk
    run(config, resume=False, overwrite=True, stop_at_step=args.steps, log=lambda m: None)
    rows = [json.loads(line) for line in (work / "ours" / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if "reward_mean" in r]
    return {
        "step_s": [1.0 / r["steps_per_s"] for r in rows],  # log_every = 1: one iteration per window
        "rollout_s": [r["time/rollout"] for r in rows],
        "completion_tokens": [r["completion_tokens"] * args.prompts * args.group for r in rows],
        "first_loss": rows[0]["loss"],
        "logprob_gap": [(r.get("logprob_gap_mean"), r.get("logprob_gap_max")) for r in rows],
        "peak_gib": torch.cuda.max_memory_allocated() / 2**30 if args.device.startswith("cuda") else None,
    }


def run_trl(args: argparse.Namespace, folder: Path, work: Path) -> dict[str, Any]:
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    tok = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=getattr(torch, args.dtype)).to(args.device)
    timings: dict[str, list[float]] = {"step_s": [], "rollout_s": [], "completion_tokens": [], "loss": []}
    generate = model.generate

    def timed_generate(*a: Any, **kw: Any) -> Any:
        sync()
        t0 = time.perf_counter()
        out = generate(*a, **kw)
        sync()
        timings["rollout_s"].append(time.perf_counter() - t0)
        prompt_len = (kw.get("input_ids") if "input_ids" in kw else a[0]).shape[1]
        new = out[:, prompt_len:]
        timings["completion_tokens"].append(float((new != tok.pad_token_id).sum()))
        return out

    def sync() -> None:
        if args.device.startswith("cuda"):
            torch.cuda.synchronize()

    model.generate = timed_generate

    class Clock(TrainerCallback):
        def on_step_begin(self, *a: Any, **kw: Any) -> None:
            sync()
            self.t0 = time.perf_counter()

        def on_step_end(self, *a: Any, **kw: Any) -> None:
            sync()
            timings["step_s"].append(time.perf_counter() - self.t0)

        def on_log(self, _args: Any, state: Any, control: Any, logs: Any = None, **kw: Any) -> None:
            if logs and "loss" in logs:
                timings["loss"].append(float(logs["loss"]))

    def reward(completions: list[Any], **kw: Any) -> list[float]:
        return [bench_reward(c[0]["content"] if isinstance(c, list) else c) for c in completions]

    from cosmos_robot.text.tasks import task_examples

    examples = task_examples("addition", "train", args.prompts, seed=0)
    data = Dataset.from_list([{"prompt": ex.prompt} for ex in examples] * (args.steps + 1))
    config = GRPOConfig(
        output_dir=str(work / "trl"),
        per_device_train_batch_size=args.prompts * args.group,
        gradient_accumulation_steps=1,
        num_generations=args.group,
        max_completion_length=args.max_new_tokens,
        temperature=1.0,
        learning_rate=1e-6,
        lr_scheduler_type="constant",
        weight_decay=0.0,
        warmup_steps=0,
        beta=0.0,
        loss_type="grpo",
        max_steps=args.steps,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        bf16=args.dtype == "bfloat16",
        use_cpu=args.device == "cpu",
        shuffle_dataset=False,
        seed=0,
    )
    trainer = GRPOTrainer(
        model=model, reward_funcs=reward, args=config, train_dataset=data, processing_class=tok, callbacks=[Clock()]
    )
    if args.device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    trainer.train()
    return {
        "step_s": timings["step_s"],
        "rollout_s": timings["rollout_s"],
        "completion_tokens": timings["completion_tokens"],
        "first_loss": timings["loss"][0] if timings["loss"] else None,
        "peak_gib": torch.cuda.max_memory_allocated() / 2**30 if args.device.startswith("cuda") else None,
    }


def summarise(name: str, r: dict[str, Any], n_params: int, prompt_tokens: int, args: argparse.Namespace) -> dict:
    steady = slice(1, None) if len(r["step_s"]) > 1 else slice(0, None)
    step = statistics.median(r["step_s"][steady])
    roll = statistics.median(r["rollout_s"][steady])
    gen = statistics.median(r["completion_tokens"][steady])
    flops = 2 * n_params * (gen + prompt_tokens) + 6 * n_params * (gen + prompt_tokens)
    return {
        "impl": name,
        "step_s": step,
        "first_step_s": r["step_s"][0],
        "rollout_s": roll,
        "rollout_tokens_per_s": gen / roll,
        "peak_gib": r["peak_gib"],
        "mfu": flops / step / (PEAK_TFLOPS * 1e12),
        "first_loss": r["first_loss"],
        "completion_tokens": gen,
        "logprob_gap": r.get("logprob_gap"),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", choices=sorted(SIZES), default="qwen3-0.6b")
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--impl", choices=["both", "ours", "trl"], default="both")
    ap.add_argument(
        "--trainer", choices=["grpo", "ppo", "opd"], default="grpo", help="our trainer (TRL runs beside grpo only)"
    )
    ap.add_argument("--engine", nargs="+", default=["transformers_static"], help="our rollout engine(s)")
    ap.add_argument("--vllm-memory", type=float, default=0.15, help="vLLM's gpu_memory_utilization (--engine vllm)")
    ap.add_argument("--micro-batch", type=int, default=None, help="our micro-batch (completions per backward)")
    ap.add_argument("--model-dir", default=None, help="(internal) the shared model folder")
    ap.add_argument("--out", default=None, help="write the results as JSON here")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="grpo_trl_"))
    if args.impl != "both":
        fn = run_ours if args.impl == "ours" else run_trl
        print("RESULT " + json.dumps(fn(args, Path(args.model_dir), work)))
        return
    folder = build_model(args.size, work / "model")
    from cosmos_robot.text.hf import load_causal_lm

    lm = load_causal_lm(folder)
    n_params = sum(p.numel() for p in lm.model.parameters())
    prompt_tokens = args.group * prompt_tokens_of(lm, args.size, args.prompts)
    del lm
    rows = []
    with_trl = args.trainer == "grpo" and args.size not in VISION
    runs = [("ours", e) for e in args.engine] + ([("trl", None)] if with_trl else [])
    for impl, engine in runs:
        cmd = [sys.executable, __file__, *sys.argv[1:], "--impl", impl, "--model-dir", str(folder)]
        cmd += ["--engine", engine] if engine else []
        proc = subprocess.run(cmd, capture_output=True, text=True, env=os.environ.copy())
        line = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
        if proc.returncode or not line:
            print(proc.stdout[-3000:], proc.stderr[-6000:], file=sys.stderr)
            raise SystemExit(f"{impl} failed (exit {proc.returncode})")
        name = f"ours ({args.trainer}, {engine})" if engine else "trl (GRPOTrainer, generate)"
        rows.append(summarise(name, json.loads(line[0][7:]), n_params, prompt_tokens, args))
    print(
        f"{args.size}: {n_params / 1e6:.1f} M parameters, {args.prompts} prompts x {args.group}, "
        f"{args.max_new_tokens} new tokens, {args.dtype} on {args.device}, median of steps 2-{args.steps}"
    )
    print("| impl | step s | first step s | rollout s | rollout tok/s | peak GiB | MFU | first loss |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        peak = f"{r['peak_gib']:.1f}" if r["peak_gib"] is not None else "-"
        print(
            f"| {r['impl']} | {r['step_s']:.3f} | {r['first_step_s']:.2f} | {r['rollout_s']:.3f} | "
            f"{r['rollout_tokens_per_s']:.0f} | {peak} | {100 * r['mfu']:.2f}% | {r['first_loss']} |"
        )
    for r in rows[:-1] if with_trl else rows:
        if r["logprob_gap"]:
            print(f"{r['impl']}: engine vs trainer log-prob gap per step (mean, max): {r['logprob_gap']}")
        if with_trl:
            print(f"speed-up of {r['impl']} (TRL step / our step): {rows[-1]['step_s'] / r['step_s']:.2f}x")
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
