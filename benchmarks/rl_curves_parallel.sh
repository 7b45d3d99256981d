#!/usr/bin/env bash
# Run several RL recipes (or variants of one) side by side on one machine, e.g. the GPU device machine,
# for a fixed wall budget each, then pack their metrics, learning curves and final evaluations into
# one archive.
#
#   bash benchmarks/rl_curves_parallel.sh OUT_TGZ MINUTES ENVS DEVICE RUN [RUN ...]
#   RUN = LABEL:RECIPE[+KEY=VALUE...]     (extra --set overrides joined by '+')
#   bash benchmarks/rl_curves_parallel.sh $OUT/rl.tgz 8 5 cuda grpo:grpo_flow_tabletop \
#       nft:nft_flow_tabletop ppo_shaped:joint_ppo_flow_tabletop+reward.shaping_coef=1.0
#
# Each run trains in its own process with ENVS env processes, `train.device=DEVICE` and
# `train.max_wall_minutes=MINUTES` (then its final evaluation), writing to runs/par_<LABEL>.
# Uses `cosmos-robot` if on PATH, else `python3 -m cosmos_robot.cli`.
set -u
out=$1; minutes=$2; envs=$3; device=$4; shift 4
if command -v cosmos-robot >/dev/null 2>&1; then cr=(cosmos-robot); else cr=(python3 -m cosmos_robot.cli); fi
mkdir -p runs
pids=(); labels=()
for run in "$@"; do
    label=${run%%:*}; spec=${run#*:}; recipe=${spec%%+*}
    extra=()
    if [[ "$spec" == *+* ]]; then
        IFS='+' read -r -a kv <<<"${spec#*+}"
        for item in "${kv[@]}"; do extra+=(--set "$item"); done
    fi
    "${cr[@]}" train "$recipe" --overwrite "${extra[@]}" \
        --set train.device="$device" --set train.max_wall_minutes="$minutes" --set train.num_threads=1 \
        --set env.num_envs="$envs" --set eval.num_envs="$envs" --set train.progress=false \
        --set output.dir="runs/par_$label" > "runs/par_$label.log" 2>&1 &
    pids+=($!); labels+=("$label")
done
status=0
for pid in "${pids[@]}"; do wait "$pid" || status=1; done
files=()
for label in "${labels[@]}"; do
    d="runs/par_$label"
    files+=("runs/par_$label.log")
    for f in "$d/metrics.jsonl" "$d/learning_curve.png" "$d/eval/final/results.json" "$d/config.resolved.json"; do
        [ -f "$f" ] && files+=("$f")
    done
done
tar czf "$out" "${files[@]}"
exit $status
