"""Load and verify an image model package (``kind = "image"``, :class:`ImageManifest`).

The same checks as :mod:`agent.inference.package` for sensor packages: the manifest parses, every
artefact's size and sha256 match, the golden-input file's sha256 matches, and the chosen artefact
reproduces the golden scores within the tolerance. A package failing any check raises
:class:`agent.errors.ModelError` and is never used.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from pydantic import ValidationError

from agent.errors import ModelError
from agent.inference.base import Backend
from cloud_sync.manifest import ImageManifest, parse_manifest

MANIFEST = "manifest.json"


@dataclass(frozen=True)
class ImagePackage:
    """A verified image package on disk (``path``, ``manifest``)."""

    path: Path
    manifest: ImageManifest

    @property
    def label(self) -> str:
        """``name@version`` for logs and metrics."""
        return f"{self.manifest.name}@{self.manifest.version}"

    @property
    def threshold(self) -> float:
        """The package's score threshold (model-score units)."""
        return float(self.manifest.score.threshold.value)


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _inside(path: Path, name: str) -> Path:
    target = path / name
    if not target.is_file() or target.resolve().parent != path.resolve():
        raise ModelError(f"package file {name} is missing", path=path)
    return target


def load_image_package(path: Path) -> ImagePackage:
    """Read and verify ``path/manifest.json``, the artefacts and the golden-input file.

    Raises:
        ModelError: missing directory or manifest, invalid JSON or schema, not an image package,
            a missing file, a size/sha256 mismatch, or golden images not shaped as the input.
    """
    mpath = path / MANIFEST
    if not mpath.is_file():
        raise ModelError("model package has no manifest.json", path=path)
    try:
        manifest = parse_manifest(json.loads(mpath.read_text(encoding="utf-8")))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ModelError(f"manifest.json is not valid JSON: {exc}", path=path) from exc
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()
        )
        raise ModelError(f"manifest.json does not match the schema: {problems}", path=path) from exc
    if not isinstance(manifest, ImageManifest):
        raise ModelError(f"{manifest.name} is a sensor model, not an image model package; use "
                         "a sensor source (replay, serial, simulator) or an image model",
                         path=path)
    inp = manifest.input
    if len(inp.mean) != inp.channels or len(inp.std) != inp.channels or min(inp.std) <= 0:
        raise ModelError("manifest input: mean/std lengths or values are invalid", path=path)
    for art in manifest.artefacts:
        apath = _inside(path, art.path)
        if apath.stat().st_size != art.size_bytes or _sha256(apath) != art.sha256:
            raise ModelError(f"artefact {art.path} fails its size/sha256 check", path=path)
    golden = _inside(path, manifest.golden.inputs_file)
    if _sha256(golden) != manifest.golden.inputs_sha256:
        raise ModelError("golden inputs fail their sha256 check", path=path)
    _check_golden_shape(golden, manifest, path)
    return ImagePackage(path, manifest)


def _check_golden_shape(golden: Path, manifest: ImageManifest, path: Path) -> None:
    """The golden images must be ``(N, C, H, W)`` of the manifest's input.

    The frames are sized from ``manifest.input`` while the golden check runs the ``.npy``'s own
    images, so a manifest whose input size or channels disagree with the model passed every
    check and then failed every frame at run time.

    Raises:
        ModelError: the file is not a readable array or its shape differs from the input spec.
    """
    inp = manifest.input
    want = (inp.channels, inp.height, inp.width)
    try:
        shape = tuple(np.load(golden, mmap_mode="r", allow_pickle=False).shape)
    except (OSError, ValueError) as exc:
        raise ModelError(f"golden inputs {golden.name} are not a readable array: {exc}",
                         path=path) from exc
    if len(shape) != 4 or shape[0] < 1 or shape[1:] != want:
        raise ModelError(
            f"golden inputs have shape {shape}, the manifest's input is (N, {want[0]}, "
            f"{want[1]}, {want[2]}) (channels, height, width): manifest and model disagree",
            path=path)


def check_image_golden(package: ImagePackage, backend: Backend) -> float:
    """Score the golden images with ``backend``; returns the largest absolute error.

    Raises:
        ModelError: a score differs by more than the package's tolerance.
    """
    g = package.manifest.golden
    x = np.load(package.path / g.inputs_file, allow_pickle=False).astype(np.float32)
    got = np.asarray(backend.run(x), dtype=np.float64).reshape(-1)
    want = np.asarray(g.outputs, dtype=np.float64)
    if got.shape != want.shape:
        raise ModelError(f"golden output shape {got.shape} != {want.shape}", model=package.label)
    err = float(np.abs(got - want).max())
    if not err <= g.atol:
        raise ModelError(f"golden images differ by {err:.4g} > tolerance {g.atol} "
                         f"({backend.name}/{backend.precision})", model=package.label)
    return err
