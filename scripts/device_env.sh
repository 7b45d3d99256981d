# scripts/device_env.sh: set up a bare GPU device machine to run cosmos-robot from this source tree.
#
# Source it (do not execute it) from the repository root at the start of a device command:
#
#     source scripts/device_env.sh && cosmos-robot train debug_joint_ppo --set train.device=cuda
#
# The device image already has Python 3.12, torch, numpy, typer, rich, msgpack, safetensors,
# tensorboard, matplotlib and pillow, but no package registry. What it lacks travels with the
# working tree as ignored folders, named in the run's `carry` (e.g. carry [".whl", ".gl"]):
#
#   .whl/  wheels of the missing third-party packages (mujoco, gymnasium, farama-notifications,
#          pyopengl, pydantic, pydantic-core, annotated-types, typing-inspection,
#          typing-extensions, websockets, pyzmq), fetched here with `pip download --no-deps
#          --only-binary=:all: --python-version 3.12 --platform manylinux_2_28_x86_64 ...`;
#          never torch or nvidia-* wheels (the device's own torch is used).
#   .gl/   the GL/EGL/Vulkan loader debs (libglvnd0 libegl1 libopengl0 libgl1 libglx0 libgles2
#          libvulkan1, via `apt-get download`) for MuJoCo's headless EGL rendering.
#
# What it does: unpacks .gl/*.deb into / and runs ldconfig; installs .whl/*.whl into /tmp/site
# (skipped when the same wheel set is already there, e.g. on a warm machine); puts /tmp/site and
# our packages' source folders (clients, policy_server, envs, trainers, the root cosmos_robot) on
# PYTHONPATH instead of installing them; sets MUJOCO_GL=egl, the NVIDIA EGL vendor file,
# HF_HUB_OFFLINE=1 and PYTHONUNBUFFERED=1; and defines a `cosmos-robot` shell function
# (`python3 -m cosmos_robot.cli`) in place of the console script. It returns non-zero on failure.

_cr_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

# GL loaders (dpkg -x into / is what the device README prescribes for exactly these debs).
if compgen -G "$_cr_root/.gl/*.deb" >/dev/null; then
    for _cr_deb in "$_cr_root"/.gl/*.deb; do
        dpkg -x "$_cr_deb" / || { echo "device_env: dpkg -x $_cr_deb failed" >&2; return 1; }
    done
    ldconfig
fi

# Third-party wheels the device image lacks.
export CR_SITE="${CR_SITE:-/tmp/site}"
if compgen -G "$_cr_root/.whl/*.whl" >/dev/null; then
    _cr_stamp="$(cd "$_cr_root/.whl" && ls -l -- *.whl | md5sum)"
    if [ "$(cat "$CR_SITE/.cr_wheels" 2>/dev/null)" != "$_cr_stamp" ]; then
        python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
            --target "$CR_SITE" "$_cr_root"/.whl/*.whl \
            || { echo "device_env: pip install of .whl failed" >&2; return 1; }
        echo "$_cr_stamp" >"$CR_SITE/.cr_wheels"
    fi
fi

# Our own packages straight from the source tree (all pure Python).
export PYTHONPATH="$CR_SITE:$_cr_root/clients/src:$_cr_root/policy_server/src:$_cr_root/envs/src:$_cr_root/trainers/src:$_cr_root${PYTHONPATH:+:$PYTHONPATH}"

# Headless MuJoCo rendering through the NVIDIA EGL driver.
export MUJOCO_GL=egl PYOPENGL_PLATFORM=egl
_cr_egl=/usr/local/nvidia/share/glvnd/egl_vendor.d/10_nvidia.json
[ -f "$_cr_egl" ] && export __EGL_VENDOR_LIBRARY_FILENAMES="$_cr_egl"
_cr_vk=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
[ -f "$_cr_vk" ] && export VK_DRIVER_FILES="$_cr_vk"

# No network there: never let Hugging Face clients try to reach the Hub; print logs as they come.
export HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1

cosmos-robot() { python3 -m cosmos_robot.cli "$@"; }

unset _cr_deb _cr_stamp _cr_egl _cr_vk
cd "$_cr_root" || return 1
unset _cr_root
true
