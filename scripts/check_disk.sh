#!/usr/bin/env bash
# Refuse to start an install that cannot fit: the full setup (torch's CUDA build and its libraries,
# the LIBERO and Python 3.10 venvs) takes about 9.5 GB in the checkout, plus pip's build space in TMPDIR.
# Usage: scripts/check_disk.sh GB [DIR...]   (exit 1 naming the folder and the shortfall)
set -u
need_gb="${1:-12}"; shift || true
dirs=("$@"); [ ${#dirs[@]} -eq 0 ] && dirs=("." "${TMPDIR:-/tmp}")
for d in "${dirs[@]}"; do
  avail_kb="$(df -Pk "$d" 2>/dev/null | awk 'NR==2 {print $4}')"
  [ -z "$avail_kb" ] && continue
  avail_gb=$((avail_kb / 1024 / 1024))
  if [ "$avail_gb" -lt "$need_gb" ]; then
    echo "error: setup needs about ${need_gb} GB free on the file system of $(cd "$d" && pwd), which has ${avail_gb} GB." >&2
    echo "Free some space (old clones, ~/.cache/pip, /tmp) or set TMPDIR to a larger disk, then run make again." >&2
    exit 1
  fi
done
