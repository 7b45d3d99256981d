#!/usr/bin/env bash
# scripts/device_pack.sh: everything a GPU benchmark session on the device machine needs, in parts that fit
# its calls, plus the job that runs the benchmarks in the background there.
#
# Why: the device machine has no registry, a call carries at most 64 MiB (the ~37 MB working tree
# included), the machine goes back 30 s after a call ends, and a session has 30 minutes of it. So
# the wheels (LeRobot's set, PyAV, MuJoCo: ~100 MB, scripts/device_wheels.sh) travel as one tar cut
# into 25 MB parts, one part per call, and the benchmarks run as one detached job that later calls poll.
#
#   scripts/device_pack.sh             # writes .devpack/p00..p03, .devpack/job.sh and .devpack/demos
#                                      # (2 episodes per task at 32 px, for groot_sft_step.py)
# Then, on one warm machine (each call within 30 s of the last):
#   calls 1-3, carry [".devpack/p0N"]: mkdir -p /tmp/parts && cp .devpack/p0N /tmp/parts/
#   call 4, carry [".devpack/p03", ".devpack/job.sh", ".devpack/demos"]:
#     cp .devpack/p03 /tmp/parts/ && mkdir -p /tmp/wh && cat /tmp/parts/p0* | tar x -C /tmp/wh &&
#     python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/gsite /tmp/wh/wheels/*.whl;
#     rm -rf /tmp/work && cp -r . /tmp/work && (setsid nohup bash /tmp/work/.devpack/job.sh > /tmp/job.out 2>&1 &);
#     sleep 400; cat /tmp/res/progress; cd /tmp && tar czf $OUT/res.tgz res
#   later calls: sleep 450; cat /tmp/res/progress; cd /tmp && tar czf $OUT/res.tgz res
# The job writes /tmp/res/<name>.log and .json per benchmark and /tmp/res/progress. Lessons of
# 2026-12-04: MuJoCo's EGL import fails there (no libEGL), so the job sets MUJOCO_GL=disable; released-
# shape runs write tens of GB, so benchmarks delete their run folders (64 GiB disk).
set -euo pipefail
cd "$(dirname "$0")/.."
grep -qx "/.devpack/" .git/info/exclude 2>/dev/null || echo "/.devpack/" >> .git/info/exclude
[ -d .whl_lerobot ] && [ -d .whl_av ] || scripts/device_wheels.sh
[ -d .whl_mj ] || scripts/device_wheels.sh text
mkdir -p .devpack
rm -rf .devpack/wheels .devpack/p0*
mkdir .devpack/wheels
cp .whl_lerobot/*.whl .whl_av/*.whl .whl_mj/*.whl .devpack/wheels/
(cd .devpack && tar cf - wheels | split -b 25000000 -d - p && rm -rf wheels)
demos=.devpack/demos
if [ ! -d "$demos" ]; then
    HF_HUB_OFFLINE=1 MUJOCO_GL=${MUJOCO_GL:-egl} .venv/bin/cosmos-robot record --episodes-per-task 2 \
        --image-size 32 --num-envs 1 --vector-mode sync --out "$demos" > /dev/null
fi
cat > .devpack/job.sh <<'JOB'
#!/bin/bash
# the device job (written by scripts/device_pack.sh): one benchmark after another, results in /tmp/res
W=/tmp/work
export PYTHONPATH=/tmp/gsite:$W:$W/clients/src:$W/policy_server/src:$W/envs/src:$W/trainers/src:$W/exporters/src
export HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 MUJOCO_GL=disable
cd $W
R=/tmp/res; mkdir -p $R
nvidia-smi > $R/smi.txt 2>&1
step() { name=$1; t=$2; shift 2; echo "$(date +%T) start $name" >> $R/progress
    timeout "$t" "$@" > $R/$name.log 2>&1; rc=$?; echo "$(date +%T) end $name rc=$rc" >> $R/progress; }
# 2026-12-05: the Cosmos3-Nano generator step rows (issue 23), then issue 19's open pi0.5 rows
G="python3 benchmarks/generator_step.py --size nano --device cuda --dtype bfloat16 --height 256 --width 256"
step gen_full 420 $G --out $R/gen_full.json
step gen_lora 300 $G --lora-rank 32 --out $R/gen_lora.json
step pi05_b8_trim 540 python3 benchmarks/pi05_latency.py --device cuda --dtype bfloat16 --skip-lerobot --compile \
    --attention math --trim-prompt --batches 8 --iters 50 --out $R/pi05_b8_trim.json
step numerics_pi05 480 python3 benchmarks/numerics_pi05.py --size full --device cuda --batch 4 --out $R/numerics_pi05.json
step gen_video 300 $G --frames 5 --lora-rank 32 --out $R/gen_video.json
echo ALLDONE >> $R/progress
JOB
du -sh .devpack/*
