#!/usr/bin/env bash
# scripts/device_wheels.sh: fetch the wheels the GPU device machine lacks for the LeRobot families'
# GPU tests and latency benchmarks (pi05, groot), into git-ignored folders that a device `run`
# carries. The device image has Python 3.12, torch, numpy, safetensors, msgpack, typer and rich, but
# no package registry; a run carries at most 64 MiB, so the set is split in two:
#
#   .whl_lerobot/  LeRobot 0.6.1, transformers 5.5.4, tokenizers, diffusers, datasets and their
#                  pure-Python needs, plus pytest, pyzmq and websockets (about 30 MB)
#   .whl_av/       PyAV (about 39 MB; LeRobot's policies import lerobot.datasets, which requires it)
#
# Two device calls on one warm machine (it stays warm 30 s after a call):
#   1. carry [".whl_lerobot"]:
#        python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/gsite .whl_lerobot/*.whl
#   (`scripts/device_wheels.sh text` fetches the text-trainer set instead: .whl_text and .whl_mj)
#   2. carry [".whl_av"]:
#        python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/gsite .whl_av/*.whl;
#        export PYTHONPATH=/tmp/gsite:$PWD:$PWD/clients/src:$PWD/policy_server/src:$PWD/envs/src:$PWD/trainers/src
#        HF_HUB_OFFLINE=1; python3 -m pytest -m gpu tests   (or a benchmarks/*_latency.py command)
set -euo pipefail
cd "$(dirname "$0")/.."

fetch() {  # fetch DIR SPEC...: binary wheels for CPython 3.12 on manylinux x86_64, no dependencies
    local dir=$1
    shift
    mkdir -p "$dir"
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_26_x86_64 \
        --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        --platform manylinux_2_5_x86_64 --platform manylinux1_x86_64 -d "$dir" "$@"
}

if [ "${1:-}" = text ]; then
    # benchmarks/text_grpo_trl.py: our text trainer and TRL's GRPOTrainer. Two calls again: .whl_text, then
    # .whl_mj (MuJoCo: the trainers import the envs package), each installed into /tmp/gsite as above
    fetch .whl_text transformers==5.5.4 tokenizers==0.22.2 trl==1.16.0 datasets==4.8.5 dill==0.4.1 \
        multiprocess==0.70.19 pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 \
        typing-inspection==0.4.5 gymnasium==1.4.0 farama-notifications==0.0.4 etils==1.15.0
    fetch .whl_mj mujoco==3.17.0 glfw==2.11.0 pyopengl==3.1.10
    du -sh .whl_text .whl_mj
    exit 0
fi

fetch .whl_lerobot lerobot==0.6.1 transformers==5.5.4 tokenizers==0.22.2 diffusers==0.42.1 datasets==4.8.5 \
    huggingface_hub==1.33.0 draccus==0.11.6 gymnasium==1.4.0 farama-notifications==0.0.6 pydantic==2.14.4 \
    pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5 typing-extensions==4.16.0 \
    dill==0.4.1 dm-tree==0.1.10 importlib-metadata==10.2.0 mergedeep==1.3.4 multiprocess==0.70.19 \
    termcolor==3.3.0 toml==0.10.2 \
    pytest==8.4.2 pytest-timeout==2.4.0 pluggy==1.7.0 iniconfig==2.3.1 pygments==2.21.0 packaging==26.4 \
    pyzmq==27.3.0 websockets==17.4
fetch .whl_av av==15.1.0
du -sh .whl_lerobot .whl_av
