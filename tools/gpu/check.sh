#!/usr/bin/env bash
# OrchWeave's GPU check, one command on a machine with one CUDA GPU and no network:
#   tools/gpu/check.sh OUT_DIR              (make gpu-check ARGS=OUT_DIR)
#   tools/gpu/check.sh --dry-run OUT_DIR    every stage on CPU at toy sizes (run in CI)
#
# 1. install: the wheels of .whl/ (tools/gpu/fetch_wheels.sh, run where PyPI is reachable) into
#    a private site folder, --no-deps --no-index, so the image's torch stays as it is; OrchWeave
#    itself runs from this working tree (PYTHONPATH);
# 2. python -m megatron.mllm.gpu_check: the stages environment, tests (pytest -m cuda),
#    calibration and mfu, each in its time box (megatron/mllm/gpu_check/driver.py).
# Writes OUT_DIR/gpu-check.json (every figure), OUT_DIR/summary.txt, OUT_DIR/gpu-check.log and
# the calibration file (calibration-h200.json on an H200), all within ORCHWEAVE_GPU_CHECK_BUDGET
# seconds (default 480: 8 minutes). Exit status: 0 when every stage passed, 1 when one failed,
# timed out or was not reached, 2 on bad arguments.
# Environment: PYTHON (default python3; the dry run prefers .venv/bin/python),
# ORCHWEAVE_GPU_SITE (the private site folder, default $TMPDIR/orchweave-gpu-site).
set -uo pipefail

root="$(cd "$(dirname "$0")/../.." && pwd)"
usage="usage: tools/gpu/check.sh [--dry-run] OUT_DIR"
dry=0
out=""
for arg in "$@"; do
  case "$arg" in
    --dry-run) dry=1 ;;
    -h|--help) echo "$usage"; exit 0 ;;
    -*) echo "error: unknown option '$arg' ($usage)" >&2; exit 2 ;;
    *) if [ -n "$out" ]; then
         echo "error: one OUT_DIR, got '$out' and '$arg' ($usage)" >&2; exit 2
       fi
       out="$arg" ;;
  esac
done
[ -n "$out" ] || { echo "error: OUT_DIR missing ($usage)" >&2; exit 2; }
mkdir -p "$out" 2>/dev/null || { echo "error: OUT_DIR '$out': cannot create it" >&2; exit 2; }
out="$(cd "$out" && pwd)"
budget="${ORCHWEAVE_GPU_CHECK_BUDGET:-480}"
case "$budget" in
  ''|*[!0-9]*) echo "error: ORCHWEAVE_GPU_CHECK_BUDGET must be whole seconds, got '$budget'" >&2
               exit 2 ;;
esac
mode=gpu
[ "$dry" = 1 ] && mode=dry-run
python="${PYTHON:-}"
if [ -z "$python" ]; then
  python=python3
  [ "$dry" = 1 ] && [ -x "$root/.venv/bin/python" ] && python="$root/.venv/bin/python"
fi
command -v "$python" >/dev/null || { echo "error: PYTHON '$python' not found" >&2; exit 2; }
log="$out/gpu-check.log"
: > "$log"
start=$SECONDS

# --- install -------------------------------------------------------------------------------
site="${ORCHWEAVE_GPU_SITE:-${TMPDIR:-/tmp}/orchweave-gpu-site}"
shopt -s nullglob
wheels=("$root"/.whl/*.whl)
shopt -u nullglob
names=""
for w in "${wheels[@]}"; do names="$names${names:+,}$(basename "$w")"; done
extra_path=""
if [ ${#wheels[@]} -gt 0 ]; then
  echo "> install: ${#wheels[@]} wheel(s) into $site" | tee -a "$log"
  if timeout 120 "$python" -m pip install --quiet --no-index --no-deps --no-compile \
       --no-cache-dir --upgrade --target "$site" "${wheels[@]}" >>"$log" 2>&1; then
    status=installed
    reason="into $site (--no-deps: the image's torch is untouched)"
    extra_path=":$site"
  else
    status=failed
    reason="pip install failed: $(tail -n 1 "$log")"
  fi
elif PYTHONPATH="$root" "$python" -c "import megatron.core" >/dev/null 2>&1; then
  status=skipped
  reason="no .whl/ folder: megatron-core is already importable"
else
  status=failed
  reason="no .whl/ folder and megatron-core is not importable: run tools/gpu/fetch_wheels.sh where PyPI is reachable and bring .whl/ along"
fi
echo "> install: $status: $reason" | tee -a "$log"
install_json="$(mktemp)"
INSTALL_STATUS="$status" INSTALL_REASON="$reason" INSTALL_WHEELS="$names" \
INSTALL_SECONDS="$((SECONDS - start))" "$python" -c '
import json, os, sys
w = os.environ["INSTALL_WHEELS"]
json.dump({"status": os.environ["INSTALL_STATUS"], "reason": os.environ["INSTALL_REASON"],
           "wheels": w.split(",") if w else [], "seconds": int(os.environ["INSTALL_SECONDS"]),
           "project": "the working tree, on PYTHONPATH"}, open(sys.argv[1], "w"))
' "$install_json"

# --- the stages ----------------------------------------------------------------------------
export PYTHONPATH="$root$extra_path${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1 ORCHWEAVE_PROGRESS=0
export PYTHONWARNINGS="${PYTHONWARNINGS:-ignore}"
# Left for the driver: the budget less what the install took, less a margin for its imports
# (10-20 s) and for writing the files after a kill.
left=$((budget - (SECONDS - start) - 10))
stages=$((left - 25))
rc=0
if [ "$status" = failed ] || [ "$stages" -le 0 ]; then
  why="$reason"
  [ "$stages" -le 0 ] && why="no time left after the install"
  rc=1
  "$python" -m megatron.mllm.gpu_check.report "$out" --killed "not run: $why" --mode "$mode" \
    --budget "$budget" --exit-status 1 >>"$log" 2>&1
else
  flags=(--out "$out" --budget "$stages" --install "$install_json")
  [ "$dry" = 1 ] && flags+=(--dry-run)
  # Both streams into the log; stderr (error lines, tracebacks) stays on stderr.
  timeout -k 10 "$left" "$python" -m megatron.mllm.gpu_check "${flags[@]}" \
    2> >(tee -a "$log" >&2) | tee -a "$log"
  rc=${PIPESTATUS[0]}
  if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
    "$python" -m megatron.mllm.gpu_check.report "$out" --mode "$mode" --budget "$budget" \
      --killed "the driver was stopped at the check's time limit ($left s)" --exit-status 1 \
      >>"$log" 2>&1
    rc=1
  elif ! grep -q '"finished": "' "$out/gpu-check.json" 2>/dev/null; then
    "$python" -m megatron.mllm.gpu_check.report "$out" --mode "$mode" --budget "$budget" \
      --killed "the driver ended with exit status $rc before it finished" \
      --exit-status "$rc" >>"$log" 2>&1
  fi
fi
rm -f "$install_json"
echo "> GPU check ($mode): exit status $rc in $((SECONDS - start)) s; $out/summary.txt" | tee -a "$log"
exit "$rc"
