#!/usr/bin/env bash
# Re-create tests/golden/qwen3_tts/*.npz from the reference Qwen3-TTS (qwen-tts 0.1.1) in its own venv.
#
# The reference pins transformers 4.57.3 / accelerate 1.12.0, so it lives in a separate virtual environment
# (default /work/qwen3tts-ref, ~1.9 GB; override with QWEN3TTS_REF_VENV), outside the repo. It gets the CPU
# torch 2.13.0 and qwen-tts without torchaudio (torchaudio from PyPI does not load with torch 2.13 and
# breaks transformers; the reference script stubs it, with a module spec, as torch and transformers probe
# imported modules' specs). The 25 Hz tokenizer imports sox and onnxruntime at import time: the venv gets the
# real packages (pysox and onnxruntime from PyPI; a plain stub has no __spec__ and breaks torch's probes), so
# the import check below passes and a second run reuses the venv. Then our code writes the preset checkpoints
# (tiny, heldout; all three variants) and the reference, in the venv, writes the golden files.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${QWEN3TTS_REF_VENV:-/work/qwen3tts-ref}"
CKPT="$(mktemp -d)"
trap 'rm -rf "$CKPT"' EXIT

if [ ! -x "$VENV/bin/python" ] || ! "$VENV/bin/python" scripts/qwen3_tts_reference.py --check 2>/dev/null; then
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q torch==2.13.0
  "$VENV/bin/python" -c "import torch, sys; sys.exit(0 if torch.__version__.endswith('+cpu') else 1)" \
    || { echo "the venv's torch is not the CPU build" >&2; exit 1; }
  echo "torch==$("$VENV/bin/python" -c 'import torch; print(torch.__version__)')" > "$CKPT/constraints.txt"
  "$VENV/bin/pip" install -q --no-deps qwen-tts==0.1.1
  "$VENV/bin/pip" install -q -c "$CKPT/constraints.txt" transformers==4.57.3 accelerate==1.12.0 librosa \
    soundfile einops safetensors numpy sox==1.5.0 onnxruntime==1.32.0
  "$VENV/bin/pip" uninstall -y -q torchaudio 2>/dev/null || true
  "$VENV/bin/python" scripts/qwen3_tts_reference.py --check || { echo "qwen_tts does not import" >&2; exit 1; }
fi

python3 - "$CKPT" <<'EOF'
import sys
from omniduplex.models.qwen3_tts.presets import write_tts_checkpoint
for preset in ("tiny", "heldout"):
    for variant in ("base", "custom_voice", "voice_design"):
        write_tts_checkpoint(f"{sys.argv[1]}/{preset}_{variant}", preset, 0, variant)
EOF
"$VENV/bin/python" scripts/qwen3_tts_reference.py "$CKPT" tests/golden/qwen3_tts
ls -l tests/golden/qwen3_tts
