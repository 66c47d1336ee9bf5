#!/usr/bin/env bash
# fetch_digits.sh [DEST] — puts the UCI handwritten digits set (digits.csv.gz, 1,797 8x8 images) at DEST, taken from
# Debian's python3-sklearn package (sklearn/datasets/data/digits.csv.gz) without installing the package:
# apt-get download + dpkg-deb -x into a temporary folder. Does nothing when DEST exists.
# DEST defaults to the cache folder zero_train looks in: ${XDG_CACHE_HOME:-$HOME/.cache}/zccl/digits.csv.gz.
# Exit status: 0 when DEST exists afterwards (its path is printed); 1 (with the reason on stderr) otherwise.
set -euo pipefail
if [[ "${1:-}" == -h || "${1:-}" == --help ]]; then
    sed -n '2,6s/^# \{0,1\}//p' "$0"
    exit 0
fi
dest=${1:-${XDG_CACHE_HOME:-$HOME/.cache}/zccl/digits.csv.gz}
if [[ -s "$dest" ]]; then
    echo "fetch_digits.sh: $dest is there already"
    exit 0
fi
echo "fetch_digits.sh: fetching the digits set from Debian's python3-sklearn package into $dest"
command -v apt-get >/dev/null && command -v dpkg-deb >/dev/null || {
    echo "fetch_digits.sh: apt-get and dpkg-deb are needed (Debian or Ubuntu)" >&2
    exit 1
}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# apt-get download runs as the _apt user when it can: the folder must be writable by it.
chmod 777 "$tmp"
if ! (cd "$tmp" && apt-get download -q python3-sklearn >"$tmp/apt.log" 2>&1); then
    echo "fetch_digits.sh: 'apt-get download python3-sklearn' failed (no apt archive reachable?):" >&2
    tail -3 "$tmp/apt.log" >&2
    exit 1
fi
deb=$(ls "$tmp"/python3-sklearn_*.deb)
dpkg-deb -x "$deb" "$tmp/x"
src=$(find "$tmp/x" -path '*sklearn/datasets/data/digits.csv.gz' | head -1)
if [[ -z "$src" ]]; then
    echo "fetch_digits.sh: $deb has no sklearn/datasets/data/digits.csv.gz" >&2
    exit 1
fi
mkdir -p "$(dirname "$dest")"
cp "$src" "$dest.tmp.$$"
mv "$dest.tmp.$$" "$dest"
echo "fetch_digits.sh: $dest from $(basename "$deb")"
