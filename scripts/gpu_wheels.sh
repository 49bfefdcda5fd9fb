#!/usr/bin/env bash
# Download the Python 3.12 x86-64 wheels that a GPU machine without network lacks into .whl/ (git-ignored),
# for the device tool to carry (carry: [".whl"]); scripts/device_check.sh installs them there with
#   pip install --no-index --no-deps --target /tmp/site .whl/*.whl
# The GPU image (torch 2.11+cu130, transformers, numpy, pyyaml, typer, jinja2, httpx, click, h11, anyio,
# requests, tqdm, ...) lacks exactly these for the stage graphs, the relay and `omniduplex respond`:
# pyzmq (relay), soxr (resampling), soundfile + cffi + pycparser (audio files), pydantic (+ core, types,
# inspection) and fastapi / starlette / uvicorn / python-multipart / websockets (the graph config and the
# app modules `respond` imports), webrtcvad-wheels (VAD) and gguf (GGUF import). One version of each (two
# stop pip's --no-index install); the versions are the ones the CPU suite runs with.
# Usage: bash scripts/gpu_wheels.sh   (needs pip and PyPI; prints the total size)
set -euo pipefail
cd "$(dirname "$0")/.."
WHEELS=(
  pyzmq==27.3.0
  soxr==1.1.0
  soundfile==0.14.0
  cffi==2.0.0
  pycparser==3.0
  pydantic==2.13.4
  pydantic-core==2.46.4
  annotated-types==0.7.0
  typing-inspection==0.4.2
  fastapi==0.136.3
  starlette==1.10.0
  uvicorn==0.54.0
  python-multipart==0.0.34
  websockets==17.4
  webrtcvad-wheels==2.0.14.post1
  gguf==0.19.0
)
rm -rf .whl && mkdir -p .whl
python3 -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: \
  --python-version 3.12 --implementation cp --abi cp312 --abi abi3 --abi none \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_26_x86_64 \
  --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  --platform manylinux_2_5_x86_64 --platform manylinux1_x86_64 --platform any \
  -d .whl "${WHEELS[@]}" 2> >(grep -v "is ignored: it is neither a file nor a directory" >&2)
n=$(ls .whl/*.whl | wc -l)
[ "$n" -eq "${#WHEELS[@]}" ] || { echo "expected ${#WHEELS[@]} wheels in .whl/, got $n" >&2; exit 1; }
echo "$n wheels in .whl/, $(du -sh .whl | cut -f1) in all:"
ls .whl
