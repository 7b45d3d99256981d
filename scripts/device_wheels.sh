#!/usr/bin/env bash
# scripts/device_wheels.sh: fetch the wheels the GPU device machine lacks for the LeRobot families'
# GPU tests and latency benchmarks (pi05, groot), into git-ignored folders that a device `run`
# carries. The device image has Python 3.12, torch, numpy, safetensors, msgpack, typer and rich, but
# no package registry; a run carries at most 64 MiB, so the set is split in two:
#
#   .whl_lerobot/  LeRobot 0.6.1, transformers 5.5.4, tokenizers, diffusers, datasets and their
#                  pure-Python needs, plus pytest, pyzmq, websockets and peft (LoRA of the generator
#                  benchmark) with its needs (about 32 MB)
#   .whl_av/       PyAV (about 39 MB; LeRobot's policies import lerobot.datasets, which requires it)
#
# Two device calls on one warm machine (it stays warm 30 s after a call):
#   1. carry [".whl_lerobot"]:
#        python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/gsite .whl_lerobot/*.whl
#   (`scripts/device_wheels.sh text` fetches the text-trainer set instead: .whl_text and .whl_mj;
#    `scripts/device_wheels.sh vllm` builds the vLLM bundle, see the end of this file)
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
        --platform manylinux_2_31_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
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

if [ "${1:-}" = vllm ]; then
    # vLLM 0.26.0 with what it imports that the device image lacks, the text set and MuJoCo, installed into one
    # folder here (CPython 3.12: .venv's pip), trimmed of what a dense-model rollout on a Hopper GPU never loads
    # (FlashAttention 2 and the MLA / FP4 / Blackwell kernels, the Rust front end: 390 MB of 730), compressed and
    # split into .vp0 ... .vp4 of 36 MiB: with the ~27 MiB working tree each fits one call's 64 MiB. On one warm
    # machine, five calls (each within 30 s of the last; they take seconds):
    #   calls 1-4, carry [".vpN"]:  mkdir -p /tmp/vp && cp .vpN/* /tmp/vp/
    #   call 5, carry [".vp4"]:     cp .vp4/* /tmp/vp/ && mkdir -p /tmp/site && cat /tmp/vp/part_* | xz -d -T8 |
    #                               tar -x -C /tmp/site, then PYTHONPATH=/tmp/site:... as above and
    #                               python3 -m pytest -m gpu tests/text/test_vllm_gpu.py, or
    #                               python3 benchmarks/text_grpo_trl.py --engine vllm transformers_static
    # xgrammar is pinned to 0.2.1: later 0.2.x fail against vLLM 0.26's apache-tvm-ffi 0.1.10. FlashInfer is left
    # out (the engine then selects vLLM's PyTorch sampler, cosmos_robot/text/vllm_engine.py).
    [ -d .whl_text ] && [ -d .whl_mj ] || "$0" text
    work=$(mktemp -d)
    fetch "$work/w" vllm==0.26.0 apache-tvm-ffi==0.1.10 astor==0.8.1 blake3==1.0.11 cachetools==8.0.2 cbor2==6.3.0 \
        compressed-tensors==0.17.0 depyf==0.20.0 diskcache==5.6.3 fastapi==0.136.3 gguf==0.19.0 httpx2==2.16.2 \
        ijson==3.6.0 jsonschema==4.26.0 jsonschema-specifications==2025.9.1 lark==1.2.2 llguidance==1.7.6 \
        msgspec==0.23.0 openai==3.57.0 openai-harmony==0.0.8 outlines-core==0.2.14 \
        partial-json-parser==0.2.1.1.post7 prometheus-client==0.26.0 py-cpuinfo==9.0.0 pybase64==1.5.1 \
        python-json-logger==4.2.0 pyzmq==27.3.0 referencing==0.37.0 rpds-py==2026.9.1 setproctitle==1.3.8 \
        sniffio==1.3.1 starlette==1.10.0 uvloop==0.23.0 watchfiles==1.3.0 xgrammar==0.2.1
    .venv/bin/python -m pip install -q --no-deps --no-compile --target "$work/site" "$work"/w/*.whl .whl_text/*.whl \
        .whl_mj/*.whl
    v="$work/site/vllm"
    rm -rf "$v"/vllm_flash_attn/_vllm_fa2_C.abi3.so "$v"/vllm-rs "$v"/_flashmla_C.abi3.so \
        "$v"/_flashmla_extension_C.abi3.so "$v"/_qutlass_C.abi3.so "$v"/_rust_tool_parser.abi3.so \
        "$v"/third_party/fmha_sm100 "$v"/third_party/deep_gemm "$v"/entrypoints/serve/instrumentator/static
    tar -C "$work/site" -cf - . | xz -T0 -6 >"$work/site.tar.xz"
    rm -rf .vp?
    split -b 36M -d -a 1 "$work/site.tar.xz" "$work/part_"
    for f in "$work"/part_*; do
        mkdir -p ".vp${f##*_}" && mv "$f" ".vp${f##*_}/"
    done
    rm -rf "$work"
    du -sh .vp?
    exit 0
fi

fetch .whl_lerobot lerobot==0.6.1 transformers==5.5.4 tokenizers==0.22.2 diffusers==0.42.1 datasets==4.8.5 \
    huggingface_hub==1.33.0 draccus==0.11.6 gymnasium==1.4.0 farama-notifications==0.0.6 pydantic==2.14.4 \
    pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5 typing-extensions==4.16.0 \
    dill==0.4.1 dm-tree==0.1.10 importlib-metadata==10.2.0 mergedeep==1.3.4 multiprocess==0.70.19 \
    termcolor==3.3.0 toml==0.10.2 \
    pytest==8.4.2 pytest-timeout==2.4.0 pluggy==1.7.0 iniconfig==2.3.1 pygments==2.21.0 packaging==26.4 \
    pyzmq==27.3.0 websockets==17.4 \
    peft==0.21.2 accelerate==1.16.0 psutil==7.2.2 pyyaml==6.0.3 tqdm==4.70.1
fetch .whl_av av==15.1.0
du -sh .whl_lerobot .whl_av
