#!/usr/bin/env bash
# scripts/device_pack.sh: everything a GPU benchmark session on the device machine needs, in parts that fit
# its calls, plus the job that runs the benchmarks in the background there.
#
# Why: the device machine has no registry, a call carries at most 64 MiB (the ~37 MB working tree
# included), the machine goes back 30 s after a call ends, and a session has 30 minutes of it. So
# the wheels travel as two tars cut into 12 MB parts (the tree itself is ~50 MiB), one part per call, and the benchmarks run as one
# detached job that later calls poll. Tar "a" (LeRobot's set: diffusers, peft, transformers; ~31 MB)
# is all the generator rows need, so the job starts after two calls; tar "b" (PyAV, MuJoCo) arrives
# with the polling calls while the generator rows run, and the job waits for /tmp/wh/b_done before
# the pi0.5 rows.
#
#   scripts/device_pack.sh             # writes .devpack/a0*, .devpack/b0*, .devpack/job.sh, .devpack/demos
# Then, on one warm machine (each call within 30 s of the last):
#   call 1, carry [".devpack/a00"]: mkdir -p /tmp/parts && cp .devpack/a00 /tmp/parts/
#   call 2, carry [".devpack/a01", ".devpack/a02", ".devpack/job.sh"]: cp .devpack/a01 .devpack/a02 /tmp/parts/ && mkdir -p /tmp/wh &&
#     cat /tmp/parts/a0* | tar x -C /tmp/wh && python3 -m pip install -q --no-index --no-deps --no-compile
#     --target /tmp/gsite /tmp/wh/wheels/*.whl; rm -rf /tmp/work && cp -r . /tmp/work &&
#     (setsid nohup bash /tmp/work/.devpack/job.sh > /tmp/job.out 2>&1 &)
#   calls 3.., carry [".devpack/b0N"]: cp .devpack/b0N /tmp/parts/; sleep N; cat /tmp/res/progress
#   after the last b part: cat /tmp/parts/b0* | tar x -C /tmp/wh && pip install ... /tmp/wh/wheels_b/*.whl &&
#     touch /tmp/wh/b_done
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
rm -rf .devpack/wheels .devpack/wheels_b .devpack/p0* .devpack/a0* .devpack/b0*
mkdir .devpack/wheels .devpack/wheels_b
cp .whl_lerobot/*.whl .devpack/wheels/
cp .whl_av/*.whl .devpack/wheels_b/  # MuJoCo: add .whl_mj/*.whl for jobs that step a simulator
(cd .devpack && tar cf - wheels | split -b 12000000 -d - a && tar cf - wheels_b | split -b 12000000 -d - b &&
    rm -rf wheels wheels_b)
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
# 2026-12-07 (7): the one pi0.5 row issue 19 still lacks, on whatever card comes (the device tool serves
# H100 for H200 and says to report timings from either; sessions 32-39 drew H100s or nothing): the compiled
# FP8 path of the paced-peers table (1-8 clients, session 34) at 16 clients, every bucket warm (--warmup
# auto: 1, 2, 4, 8, 16 at both prompt shapes, ~14 min of compiles), clients from 16 down so the missing
# row comes first. Job (5) measured 1-16 only on CUDA graphs without torch.compile (2.7x slower calls).
# pi0.5's LeRobot import needs PyAV (tar "b"); MuJoCo is not needed here.
for _ in $(seq 120); do [ -f /tmp/wh/b_done ] && break; sleep 5; done
step sweep_pi05_compiled 1500 python3 benchmarks/serving_sweep.py --build pi05 --size released --device cuda \
    -a precision=fp8 -a compile=true -a attention=math -a trim_prompt=112 \
    --prompt "pick up the black bowl and place it on the plate" --max-batch 16 --clients 16 8 4 2 1 \
    --duration 5 --out $R/sweep_pi05_compiled.json
echo ALLDONE >> $R/progress
JOB
du -sh .devpack/*
