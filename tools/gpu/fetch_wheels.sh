#!/usr/bin/env bash
# The wheels the GPU machine lacks, for its Python 3.12 on x86-64, into .whl/ (ignored by git),
# so that tools/gpu/check.sh installs them there without a network. Run it where PyPI is
# reachable; it lists every wheel with its size and the total, and fails when the total is over
# 48 MiB (everything that travels with the working tree is 64 MiB at most).
#
#   tools/gpu/fetch_wheels.sh                 download into .whl/, then check it
#   tools/gpu/fetch_wheels.sh --dest DIR      download into DIR, then check it
#   tools/gpu/fetch_wheels.sh --check DIR     only list and check DIR (no network)
#
# What the GPU image lacks: it has torch (2.11, CUDA 13), numpy, packaging, pytest,
# pytest-timeout, tqdm, tensorboard and the rest of what OrchWeave imports, but not
# megatron-core, whose own requirements are torch, numpy and packaging. OrchWeave itself is
# not a wheel: check.sh puts the working tree on PYTHONPATH.
set -euo pipefail

root="$(cd "$(dirname "$0")/../.." && pwd)"
WHEELS=("megatron-core==0.19.2")
LIMIT_MIB=48
PLATFORMS=(manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_24_x86_64
           manylinux_2_17_x86_64 manylinux2014_x86_64)

die() { echo "error: $1" >&2; exit "${2:-1}"; }
mib() { awk -v b="$1" 'BEGIN { printf "%.2f", b / 1048576 }'; }

# The distribution name of a wheel file, normalised (megatron_core-0.19.2-... -> megatron-core).
dist_of() { basename "$1" | cut -d- -f1 | tr '[:upper:]_.' '[:lower:]--'; }

listed() {  # is distribution $1 one of WHEELS?
  local w
  for w in "${WHEELS[@]}"; do
    [ "$(echo "${w%%==*}" | tr '[:upper:]_.' '[:lower:]--')" = "$1" ] && return 0
  done
  return 1
}

check_dir() {
  local dir="$1" total=0 size f d
  local -A seen=()
  shopt -s nullglob
  local files=("$dir"/*.whl)
  shopt -u nullglob
  [ ${#files[@]} -gt 0 ] || die "$dir: no wheels (*.whl) in it"
  echo "wheels in $dir:"
  for f in "${files[@]}"; do
    size=$(stat -c %s "$f")
    total=$((total + size))
    d=$(dist_of "$f")
    printf '  %-72s %8s MiB\n' "$(basename "$f")" "$(mib "$size")"
    [ -z "${seen[$d]:-}" ] || die "$dir: two wheels of $d ($(basename "${seen[$d]}") and $(basename "$f")): keep one, pip installs both and fails"
    seen[$d]="$f"
    listed "$d" || die "$dir: $(basename "$f") is not on this script's list (${WHEELS[*]}): remove it"
  done
  printf 'total: %d wheel(s), %s MiB (limit %d MiB)\n' "${#files[@]}" "$(mib "$total")" "$LIMIT_MIB"
  [ "$total" -le $((LIMIT_MIB * 1048576)) ] || \
    die "$dir: the wheels total $(mib "$total") MiB, over the $LIMIT_MIB MiB limit"
}

dest="$root/.whl"
case "${1:-}" in
  --check) [ $# -eq 2 ] || die "usage: $0 --check DIR" 2; [ -d "$2" ] || die "--check $2: not a directory" 2
           check_dir "$2"; exit 0 ;;
  --dest) [ $# -eq 2 ] || die "usage: $0 --dest DIR" 2; dest="$2" ;;
  "") ;;
  *) die "unknown argument '$1' (usage: $0 [--dest DIR | --check DIR])" 2 ;;
esac

python="${PYTHON:-}"
if [ -z "$python" ]; then
  if [ -x "$root/.venv/bin/python" ]; then python="$root/.venv/bin/python"; else python=python3; fi
fi
mkdir -p "$dest" || die "--dest $dest: cannot create it" 2
platform_flags=()
for p in "${PLATFORMS[@]}"; do platform_flags+=(--platform "$p"); done
echo "downloading ${WHEELS[*]} for CPython 3.12 on x86-64 into $dest"
"$python" -m pip download --quiet --no-deps --only-binary=:all: --implementation cp \
  --python-version 3.12 "${platform_flags[@]}" --dest "$dest" "${WHEELS[@]}" \
  || die "pip download failed (is PyPI reachable from here?)"
check_dir "$dest"
