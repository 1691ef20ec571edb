"""Model package loading and verification on a copy of models/skab-wstat."""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from agent.errors import ModelError
from agent.inference.package import MANIFEST, load_package, open_backend

SHIPPED = Path(__file__).resolve().parents[2] / "models" / "skab-wstat"
_SHIPPED_MANIFEST = json.loads((SHIPPED / MANIFEST).read_text())
#: The shipped package's label and fixed window (``builtin:skab-wstat``).
LABEL = f"skab-wstat@{_SHIPPED_MANIFEST['version']}"
WINDOW = int(_SHIPPED_MANIFEST["input"]["window"])


@pytest.fixture
def pkg(tmp_path: Path) -> Path:
    dst = tmp_path / "skab-wstat"
    shutil.copytree(SHIPPED, dst)
    return dst


def edit_manifest(pkg: Path, change: Callable[[dict[str, Any]], None]) -> None:
    m = json.loads((pkg / MANIFEST).read_text())
    change(m)
    (pkg / MANIFEST).write_text(json.dumps(m, indent=1))


def test_shipped_copy_loads(pkg: Path) -> None:
    p = load_package(pkg)
    assert p.label == LABEL
    assert p.path == pkg
    assert {(a.runtime, a.precision) for a in p.manifest.artefacts} == {
        ("onnxruntime", "int8"), ("onnxruntime", "fp32"), ("openvino", "int8"), ("litert", "int8")
    }
    spec = p.detector_spec()
    assert spec.window == WINDOW and len(spec.channels) == 8
    assert spec.feature_std_floor.shape == (24,)
    assert spec.calibration_samples == 400


def test_bit_flip_in_artefact_fails_sha256(pkg: Path) -> None:
    art = pkg / "model.int8.onnx"
    data = bytearray(art.read_bytes())
    data[len(data) // 2] ^= 0x01
    art.write_bytes(bytes(data))
    with pytest.raises(ModelError, match=r"model\.int8\.onnx fails its sha256 check"):
        load_package(pkg)


def test_truncated_artefact_fails_size_check(pkg: Path) -> None:
    art = pkg / "model.fp32.onnx"
    size = art.stat().st_size
    art.write_bytes(art.read_bytes()[:-10])
    with pytest.raises(ModelError, match=rf"has {size - 10} bytes, manifest says {size}"):
        load_package(pkg)


def test_missing_artefact(pkg: Path) -> None:
    (pkg / "model.fp32.onnx").unlink()
    with pytest.raises(ModelError, match=r"model\.fp32\.onnx is missing"):
        load_package(pkg)


def test_missing_manifest(pkg: Path) -> None:
    (pkg / MANIFEST).unlink()
    with pytest.raises(ModelError, match=r"no manifest\.json"):
        load_package(pkg)


def test_missing_directory(tmp_path: Path) -> None:
    with pytest.raises(ModelError, match="directory does not exist"):
        load_package(tmp_path / "nope")


@pytest.mark.parametrize("text", ["{", "", "not json", '{"format": 1,}'])
def test_bad_json(pkg: Path, text: str) -> None:
    (pkg / MANIFEST).write_text(text)
    with pytest.raises(ModelError, match="not valid JSON"):
        load_package(pkg)


def test_manifest_not_utf8(pkg: Path) -> None:
    (pkg / MANIFEST).write_bytes(b'{"name": "\xff\xfe"}')
    with pytest.raises(ModelError, match="not valid JSON"):
        load_package(pkg)


@pytest.mark.parametrize(
    ("change", "where"),
    [
        (lambda m: m.update(colour="blue"), "colour"),
        (lambda m: m["input"].update(extra=1), "input.extra"),
        (lambda m: m["artefacts"][0].update(signed_by="me"), "artefacts.0.signed_by"),
        (lambda m: m.pop("golden"), "golden"),
        (lambda m: m.update(version=0), "version"),
        (lambda m: m["input"].update(window=1), "input.window"),
        (lambda m: m["artefacts"][0].update(sha256="XYZ"), "artefacts.0.sha256"),
        (lambda m: m["artefacts"][0].update(runtime="tensorrt"), "artefacts.0.runtime"),
        (lambda m: m["score"]["threshold"].update(quantile=1.5), "score.threshold.quantile"),
    ],
)
def test_schema_violations_name_the_key(
    pkg: Path, change: Callable[[dict[str, Any]], None], where: str
) -> None:
    edit_manifest(pkg, change)
    with pytest.raises(ModelError, match="does not match the schema") as err:
        load_package(pkg)
    assert where in str(err.value)


@pytest.mark.parametrize(
    "change",
    [
        lambda m: m["input"]["units"].pop(),
        lambda m: m["preprocessing"]["scale_floor"].append(1.0),
        lambda m: m["score"]["feature_std_floor"].pop(),
        lambda m: m["score"]["features"].pop(),  # F = 2 x 8 but the floor has 24
        lambda m: m["input"]["channels"].pop(),
    ],
)
def test_field_lengths_must_agree(pkg: Path, change: Callable[[dict[str, Any]], None]) -> None:
    edit_manifest(pkg, change)
    with pytest.raises(ModelError, match="field lengths disagree with the channel count"):
        load_package(pkg)


@pytest.mark.parametrize("precision", ["int8", "fp32"])
def test_tampered_golden_outputs_fail_open_backend(pkg: Path, precision: str) -> None:
    pytest.importorskip("onnxruntime")

    def tamper(m: dict[str, Any]) -> None:
        m["golden"]["outputs"][3][5] += 0.5  # hashes of the artefacts still match

    edit_manifest(pkg, tamper)
    p = load_package(pkg)  # the package itself verifies ...
    with pytest.raises(ModelError, match="golden vectors differ") as err:
        open_backend(p, precision)  # ... but its artefact does not reproduce the outputs
    assert precision in str(err.value) and LABEL in str(err.value)


def test_open_backend_on_an_intact_copy(pkg: Path) -> None:
    pytest.importorskip("onnxruntime")
    b = open_backend(load_package(pkg), "int8")
    assert b.precision == "int8"
    assert b.run(np.zeros((1, WINDOW, 8), np.float32)).shape == (1, 24)


def test_unknown_precision_artefact(pkg: Path) -> None:
    p = load_package(pkg)
    with pytest.raises(ModelError, match="no litert/fp32 artefact"):
        p.artefact("litert", "fp32")


def _point_artefact_at(pkg: Path, rel: str, target: Path) -> None:
    """Make artefact 0 name ``rel`` with ``target``'s true size and hash."""
    data = target.read_bytes()

    def change(m: dict[str, Any]) -> None:
        m["artefacts"][0].update(
            path=rel, size_bytes=len(data), sha256=hashlib.sha256(data).hexdigest()
        )

    edit_manifest(pkg, change)


def test_artefact_path_escaping_the_directory_is_rejected(pkg: Path) -> None:
    # a real file outside the package with a matching size and hash: only the path check stops it
    outside = pkg.parent / "x"
    shutil.copy(pkg / "model.int8.onnx", outside)
    _point_artefact_at(pkg, "../x", outside)
    with pytest.raises(ModelError, match=r"\.\./x"):
        load_package(pkg)


def test_absolute_artefact_path_is_rejected(pkg: Path) -> None:
    outside = pkg.parent / "abs.onnx"
    shutil.copy(pkg / "model.int8.onnx", outside)
    _point_artefact_at(pkg, str(outside), outside)
    with pytest.raises(ModelError, match=r"abs\.onnx"):
        load_package(pkg)


def test_symlink_out_of_the_directory_is_rejected(pkg: Path) -> None:
    outside = pkg.parent / "elsewhere.onnx"
    shutil.copy(pkg / "model.int8.onnx", outside)
    (pkg / "link.onnx").symlink_to(outside)
    _point_artefact_at(pkg, "link.onnx", outside)
    with pytest.raises(ModelError, match=r"link\.onnx"):
        load_package(pkg)


def test_detector_spec_rejects_window_override(pkg: Path) -> None:
    p = load_package(pkg)
    with pytest.raises(ModelError, match=f"fixed window {WINDOW}"):
        p.detector_spec(window=WINDOW + 1)
    spec = p.detector_spec(window=WINDOW, hop=5, calibration_samples=1000, threshold_factor=2.0)
    assert (spec.hop, spec.calibration_samples, spec.threshold_factor) == (5, 1000, 2.0)
