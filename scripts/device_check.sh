#!/usr/bin/env bash
# One round of GPU checks (issues 33, 41) on a lent GPU machine, in one call of at most ~9 minutes:
#   bash scripts/device_check.sh [OUTDIR]     (OUTDIR: default $OUT when set, else ./device-check-out)
# Sets itself up without installing the project: the wheels carried in .whl/ (scripts/gpu_wheels.sh) go to
# /tmp/site (pip --no-index --no-deps --target), each top-level folder is linked into /tmp/pkg/omniduplex/,
# PYTHONPATH=/tmp/site:/tmp/pkg and an `omniduplex` shim runs omniduplex.cli.main. Then the parts, each
# under its own `timeout` (a hang costs only its part), cheapest and most informative first:
#   triton_tests  the paged decode kernel's tests, compiled (TRITON_INTERPRET unset)
#   gpu_tests     python3 -m pytest -m gpu: every shape on CUDA (in-process, stage processes), fp32 parity
#   attention     python3 -m omniduplex.benchmarks.bench_attention --json OUTDIR/attention.json --time-budget 16
#   shapes        every shape through deploy/graph-gpu.yaml with TTFP (scripts/device_check.py shapes)
#   real_shapes   the real-size presets built on the GPU, one short decode (scripts/device_real.py)
#   sweep         omniduplex bench serve-sweep --preset real on graph-gpu.yaml (Qwen3-TTS, then Qwen3-Omni
#                 with Code2Wav batched across turns, then at one forward per turn: --code2wav-batch 64,1)
#   engine        omniduplex bench engine --device cuda --concurrency 1,8,128 --json OUTDIR/engine.json
#   duplex        omniduplex bench duplex --device cuda --preset 7b --graphs cuda --json OUTDIR/duplex.json
# A part whose module or option is not there yet is recorded "missing". OUTDIR gets at most 11 files:
# device_check.log (everything printed), summary.json (each part's status, rc, seconds, key figures, the
# targets met and output tail), gpu_tests.xml, triton_tests.xml, attention.json, engine.json, shapes.json,
# real.json, sweep.json, duplex.json (each JSON rewritten as its rows finish: a part cut short keeps what it
# measured). The table of parts is printed last. Budgets (s): DEVICE_CHECK_TOTAL_S (default 530) for the
# whole run; a part may use the
# time earlier parts left unused, never the budgets of the parts after it.
# On a machine without CUDA it runs through, each part that needs CUDA failing with one line.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
OUTDIR=${1:-${OUT:-$ROOT/device-check-out}}
mkdir -p "$OUTDIR" && OUTDIR=$(cd "$OUTDIR" && pwd)
WORK=$(mktemp -d /tmp/device-check.XXXXXX)
SITE=${DEVICE_CHECK_SITE:-/tmp/site}
PKG=${DEVICE_CHECK_PKG:-/tmp/pkg}
TOTAL_S=${DEVICE_CHECK_TOTAL_S:-530}
SUMMARY_RESERVE_S=15
T0=$(date +%s)
DEADLINE=$((T0 + TOTAL_S))
export PYTHONUNBUFFERED=1
exec > >(tee "$OUTDIR/device_check.log") 2>&1

echo "==== device check: $(date -u +%FT%TZ), repo $ROOT, out $OUTDIR, budget ${TOTAL_S}s"

# ---- setup: wheels, package links, shim ---------------------------------------------------------------
setup_t0=$(date +%s)
setup_note=""
if ls .whl/*.whl >/dev/null 2>&1; then
  if python3 -c 'import sys; sys.exit(sys.version_info[:2] != (3, 12))'; then
    mkdir -p "$SITE"
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" \
      .whl/*.whl || setup_note="the wheels in .whl/ did not install"
    echo "setup: $(ls .whl/*.whl | wc -l) wheels from .whl/ installed into $SITE"
  else
    echo "setup: .whl/ holds Python 3.12 wheels, this is $(python3 -V): using the installed packages"
  fi
else
  echo "setup: no .whl/ (scripts/gpu_wheels.sh makes it where pip works): using the installed packages"
fi
mkdir -p "$PKG/omniduplex" "$PKG/bin"
for d in */; do ln -sfn "$ROOT/${d%/}" "$PKG/omniduplex/${d%/}"; done
printf '#!/bin/sh\nexec python3 -m omniduplex.cli.main "$@"\n' > "$PKG/bin/omniduplex"
chmod +x "$PKG/bin/omniduplex"
export PATH="$PKG/bin:$PATH"
export PYTHONPATH="$SITE:$PKG${PYTHONPATH:+:$PYTHONPATH}"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null \
  || echo "nvidia-smi: not found (no NVIDIA driver on this machine)"
python3 - "$WORK/env.json" <<'EOF' || setup_note="${setup_note:+$setup_note; }the environment probe failed"
import json, platform, sys
env = {"python": platform.python_version()}
import torch
env.update(torch=torch.__version__, torch_cuda=torch.version.cuda, cuda=torch.cuda.is_available())
if env["cuda"]:
    p = torch.cuda.get_device_properties(0)
    env.update(gpu=p.name, gpu_mem_gib=round(p.total_memory / 2**30, 1), sm=f"{p.major}.{p.minor}")
for name in ("triton", "transformers", "numpy", "zmq", "soxr", "soundfile", "pydantic", "fastapi"):
    try:
        env[name] = __import__(name).__version__
    except Exception as e:
        env[name] = f"missing ({type(e).__name__})"
import omniduplex.cli.main as m
env["omniduplex"] = m.__file__.rsplit("/cli/", 1)[0]
print(" | ".join(f"{k} {v}" for k, v in env.items()))
json.dump(env, open(sys.argv[1], "w"))
EOF
HAS_CUDA=$(python3 -c 'import json,sys; print(int(json.load(open(sys.argv[1])).get("cuda", False)))' \
  "$WORK/env.json" 2>/dev/null || echo 0)
printf 'setup\t%s\t%s\t0\t%s\n' "$([ -z "$setup_note" ] && echo 0 || echo 1)" "$(($(date +%s) - setup_t0))" \
  "${setup_note:-ok}" > "$WORK/parts.tsv"

# ---- the parts ------------------------------------------------------------------------------------------
PARTS=(triton_tests gpu_tests attention shapes real_shapes sweep engine duplex)
declare -A BUDGET=([triton_tests]=35 [gpu_tests]=100 [attention]=30 [shapes]=60 [real_shapes]=55 [sweep]=100
  [engine]=70 [duplex]=80)

later_budget() {  # the budgets of the parts after $1
  local seen=0 sum=0 p
  for p in "${PARTS[@]}"; do
    [ "$seen" = 1 ] && sum=$((sum + BUDGET[$p]))
    [ "$p" = "$1" ] && seen=1
  done
  echo "$sum"
}

record() {  # name rc seconds timeout note
  printf '%s\t%s\t%s\t%s\t%s\n' "$@" >> "$WORK/parts.tsv"
}

note_only() {  # name note: a part that does not run here, in one line
  echo "$1: $2"
  echo "$1: $2" > "$WORK/$1.out"
  record "$1" "" 0 0 "$2"
}

run_part() {  # name command...: run under the part's time budget, output to the log and WORK/name.out
  local name=$1; shift
  local now left t rc start
  now=$(date +%s)
  left=$((DEADLINE - SUMMARY_RESERVE_S - now))
  t=$((left - $(later_budget "$name")))
  [ "$t" -lt "${BUDGET[$name]}" ] && t=${BUDGET[$name]}
  [ "$t" -gt "$left" ] && t=$left
  if [ "$t" -lt 10 ]; then note_only "$name" "skipped: no time left in the ${TOTAL_S}s budget"; return; fi
  echo
  echo "==== $name (timeout ${t}s): $*"
  start=$(date +%s)
  timeout -k 5 "$t" "$@" 2>&1 | tee "$WORK/$name.out"
  rc=${PIPESTATUS[0]}
  record "$name" "$rc" "$(($(date +%s) - start))" "$t" ""
  echo "==== $name: rc $rc in $(($(date +%s) - start))s"
}

GPU_TEST_FILES=$(grep -rlE --include='test_*.py' 'pytest\.mark\.gpu|mark\.gpu\b' tests | sort | tr '\n' ' ')
PYTEST=(python3 -m pytest -q -rs -p no:cacheprovider)
python3 -c 'import pytest_timeout' 2>/dev/null && PYTEST+=(--timeout 150)  # one hung test fails alone

for part in "${PARTS[@]}"; do
  case $part in
    triton_tests)
      if [ "$HAS_CUDA" != 1 ]; then
        note_only triton_tests "CUDA required: the decode kernel's compiled tests need a GPU (not run)"
      else
        run_part triton_tests env TRITON_INTERPRET=0 "${PYTEST[@]}" tests/test_paged_decode_triton.py tests/test_triton_ops.py \
          --junitxml="$OUTDIR/triton_tests.xml"
      fi ;;
    gpu_tests)
      if [ -z "$GPU_TEST_FILES" ]; then note_only gpu_tests "missing: no test module carries the gpu marker"
      else run_part gpu_tests "${PYTEST[@]}" -m gpu $GPU_TEST_FILES --junitxml="$OUTDIR/gpu_tests.xml"; fi ;;
    attention)
      if ! python3 -c 'import importlib.util as u, sys
sys.exit(u.find_spec("omniduplex.benchmarks.bench_attention") is None)' 2>/dev/null; then
        note_only attention "missing: omniduplex.benchmarks.bench_attention is not in this tree"
      else
        # batch 1..128 x ctx 1024/4096, rows saved as they finish; no new cell after 16 s (startup ~6 s, the last cell ~2 s: inside its 30 s)
        run_part attention python3 -m omniduplex.benchmarks.bench_attention --json "$OUTDIR/attention.json" \
          --time-budget 16
      fi ;;
    shapes)
      run_part shapes python3 scripts/device_check.py shapes --json "$OUTDIR/shapes.json" ;;
    real_shapes)
      if [ "$HAS_CUDA" != 1 ]; then
        note_only real_shapes "CUDA required: the real-size presets are built on the GPU (dry run: python3 scripts/device_real.py --json x --device cpu --depth 1)"
      else
        run_part real_shapes python3 scripts/device_real.py --fp8 --json "$OUTDIR/real.json"
      fi ;;
    sweep)
      if [ "$HAS_CUDA" != 1 ]; then
        note_only sweep "CUDA required: the real-size sweep runs on graph-gpu.yaml (CPU: omniduplex bench serve-sweep)"
      else
        run_part sweep omniduplex bench serve-sweep --preset real --graph deploy/graph-gpu.yaml \
          --graphs qwen3-tts,qwen3-omni --concurrency 1,8,32,64 --frames 25 --max-tokens 16 \
          --code2wav-batch 64,1 --json "$OUTDIR/sweep.json"
      fi ;;
    engine)
      # grep without -q reads all the help: -q exits at the first match, and under pipefail the SIGPIPE it
      # gives the CLI read as "no --device option"
      if ! timeout 60 omniduplex bench engine --help 2>/dev/null | grep -- '--device' >/dev/null; then
        note_only engine "missing: 'omniduplex bench engine' has no --device option in this tree"
      else
        run_part engine omniduplex bench engine --device cuda --concurrency 1,8,128 --json "$OUTDIR/engine.json"
      fi ;;
    duplex)  # the full-duplex frame engine at the real Moshi 7B shape, random weights (issue 42)
      run_part duplex omniduplex bench duplex --device cuda --preset 7b --dtype bfloat16 --graphs cuda \
        --sessions 1,8,32 --ticks 20 --dialog-sessions 0 --threads 8 --json "$OUTDIR/duplex.json" ;;
  esac
done

echo
python3 scripts/device_check.py summary --out "$OUTDIR" --work "$WORK" || echo "summary: the helper failed"
echo "==== device check done in $(($(date +%s) - T0))s; files in $OUTDIR: $(ls "$OUTDIR" | tr '\n' ' ')"
rm -rf "$WORK"
