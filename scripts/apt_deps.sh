#!/usr/bin/env bash
# Install the Debian packages listed in apt-packages.txt that are missing (headless GL for MuJoCo, ...).
# Runs apt-get only when something is missing; needs root (or sudo) in that case.
set -euo pipefail
list="$(dirname "$0")/../apt-packages.txt"
missing=()
while read -r pkg _; do
  [ -z "$pkg" ] || [ "${pkg#\#}" != "$pkg" ] && continue
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done < "$list"
[ ${#missing[@]} -eq 0 ] && exit 0
echo "apt: installing missing system packages: ${missing[*]}"
SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
if ! command -v apt-get >/dev/null 2>&1; then
  echo "error: apt-get not found; install these system packages by hand: ${missing[*]}" >&2; exit 1
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
log="$(mktemp)"
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >"$log" 2>&1 || { cat "$log" >&2; exit 1; }
echo "apt: done"
