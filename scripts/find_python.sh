#!/usr/bin/env bash
# Print the path of a CPython X.Y interpreter (default 3.12), searching PATH, pyenv and uv.
# Usage: scripts/find_python.sh 3.12      (exit 1 with install advice when none is found)
set -u
want="${1:-3.12}"
override_var="PYTHON${want//./}"          # e.g. PYTHON312=/opt/python/bin/python3.12
candidates=()
[ -n "${!override_var:-}" ] && candidates+=("${!override_var}")
candidates+=("python${want}")
pyenv_root="${PYENV_ROOT:-$HOME/.pyenv}"
if command -v pyenv >/dev/null 2>&1; then pyenv_root="$(pyenv root)"; fi
for d in "$pyenv_root"/versions/"${want}"*; do [ -x "$d/bin/python" ] && candidates+=("$d/bin/python"); done
candidates+=("/usr/local/bin/python${want}" "/usr/bin/python${want}")
if command -v uv >/dev/null 2>&1; then
  p="$(uv python find "${want}" 2>/dev/null || true)"; [ -n "$p" ] && candidates+=("$p")
fi
for c in "${candidates[@]}"; do
  if command -v "$c" >/dev/null 2>&1; then
    v="$("$c" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null || true)"
    if [ "$v" = "$want" ]; then command -v "$c"; exit 0; fi
  fi
done
cat >&2 <<MSG
error: no Python ${want} interpreter found (looked at \$${override_var}, python${want} on PATH, ${pyenv_root}/versions/${want}*, /usr/bin, uv).
Install one of these ways, then run make again:
  pyenv install ${want}            # https://github.com/pyenv/pyenv
  uv python install ${want}        # https://docs.astral.sh/uv/
  sudo apt-get install python${want} python${want}-venv   # Debian 13 / Ubuntu 24.04 for 3.12
or point to an existing one:  make ${override_var}=/path/to/python${want} ...
MSG
exit 1
