"""Recipe step: a TFLite INT8 artefact of an ``mtd-patchcore`` package, for LiteRT.

    python models/recipes/mtd_tflite.py --package models/mtd-patchcore \\
        --data ../shared/datasets/mtd --out /tmp/model.int8.tflite

Route (needs the ``tflite-image`` extra: TensorFlow, onnx2tf, onnxsim; build machines only):

1. The feature trunk of the package's FP32 ONNX file (everything up to the patch features, the
   graph's ``/features/`` nodes) is cut out with :func:`onnx.utils.extract_model`, simplified by
   onnxsim (it folds the ``Shape`` arithmetic that sizes the upsampling) and converted to a
   TensorFlow SavedModel by onnx2tf. The input stays ``(B, 1, S, S)`` (``keep_shape_absolutely``),
   as the agent feeds every runtime; the features come out channels-last ``(B, G, G, C)``.
2. The kNN head is written in TensorFlow from the ONNX file's bank tensors (``bank_mu``,
   ``bank_w``, ``bank_sq`` and, for the coarse-to-fine search, ``coarse_w``, ``coarse_sq`` and the
   ``TopK`` size): the same arithmetic as ``mtd_patchcore.full_model``. onnx2tf cannot convert
   the head itself (its NCHW->NHWC rewriting of ``Expand``/``GatherElements`` fails:
   "Dimensions must be equal, but are 64 and 152").
3. The TFLite converter quantizes it (full-integer post-training quantization,
   ``Optimize.DEFAULT`` with a representative dataset: the calibration images, one per step;
   per-channel int8 weights): the trunk (with its pooling, upsampling and concatenation, which
   TFLite requantizes to one scale) and the two bank products (``FULLY_CONNECTED``, int8 weights
   and activations, each followed by its ReduceMin on the int8 output) run int8. The arithmetic
   after them (``|z|^2``, the additions, the shortlist ``TopK``/``Gather``, ReduceMax, Sqrt)
   stays float (``QuantizationDebugger`` deny-list: TFLite's documented selective
   quantization): a full-integer graph quantizes the score on the calibration images' range, so
   every score above the largest calibration score comes out as that score (a held-out good
   image of FP32 score 29.2 scored 21.9; every defect would too). :func:`tflite_int8` refuses a
   model whose Sqrt is not float.

Input and output stay float32, batch dynamic (the golden check runs three images in one call).

Measured (package v2 of 909f284, 661 fit images as calibration, TensorFlow 2.21.0, onnx2tf
1.28.8, onnxsim 0.8.1; AMD EPYC, AVX2 without VNNI, load 2.5-4.5 from other jobs; /tmp
scripts): 4.19 MB; conversion about 2 min. The 100 held-out good images, |INT8 - FP32| max
2.97, mean 1.20 (OpenVINO IR: 3.55, 0.61; ONNX Runtime QDQ: 5.05, 2.58), scores higher by 1.1
on average; golden images off by at most 1.75 (atol 7.57). All 353 MTD test images: max 3.39,
mean 0.76, Spearman with FP32 0.987 (OpenVINO 0.992); image AUROC read afterwards 0.9523
(OpenVINO INT8 0.9536, FP32 0.9542). One image, one thread, interleaved, p50: LiteRT INT8
20.6 ms, OpenVINO INT8 IR 14.0 ms, ONNX Runtime FP32 20.1 ms; a LiteRT FP32 conversion of the
same graph ran 19.4 ms against 20.7 ms INT8 in another run: without VNNI, XNNPACK's int8 kernels
gain nothing here. Tried and not kept: the bank products float too (max 3.25, mean 1.15, 11.9
MB); the first two trunk layers float (the largest per-layer error in the debugger's
statistics; mean 1.26 -> 1.04 with the score still saturated, not retried after the fix).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

#: The ONNX tensors the head is built from (``mtd_patchcore.full_model``'s buffers).
BANK = ("bank_mu", "bank_w", "bank_sq")
COARSE = ("coarse_w", "coarse_sq")
#: Head tensors kept float: the names :func:`_head` gives its ops; the Sqrt producing the
#: function's output is named ``Identity`` by the converter.
FLOAT_HEAD = ("d2c_min", "zz_sq", "zz", "d2c", "z_short", "zz_short", "d2_min", "d2",
              "d2_max", "d2_pos", "Identity")


def features_output(model: Any) -> str:
    """Name of the patch-feature tensor of a ``full_model`` ONNX graph.

    It is the one tensor that a ``/features/`` node produces and a node outside ``/features/``
    consumes.

    Raises:
        ValueError: there is not exactly one such tensor.
    """
    made = {o for n in model.graph.node if n.name.startswith("/features/") for o in n.output}
    used = {i for n in model.graph.node if not n.name.startswith("/features/")
            for i in n.input if i in made}
    if len(used) != 1:
        raise ValueError(f"expected one feature tensor leaving /features/, found {sorted(used)}")
    return str(used.pop())


def head_constants(model: Any) -> tuple[dict[str, np.ndarray], int]:
    """The bank tensors of a ``full_model`` ONNX graph and its shortlist size (0: exact search).

    Returns:
        ``({name: float32 array}, shortlist)``: ``bank_mu`` ``(C,)``, ``bank_w`` ``(C, N)``,
        ``bank_sq`` ``(N,)``, and with a shortlist also ``coarse_w`` ``(C, M)``, ``coarse_sq``
        ``(M,)``.

    Raises:
        KeyError: a bank tensor (an initializer or a ``Constant`` node) is missing.
    """
    from onnx import numpy_helper  # noqa: PLC0415

    init = {i.name: i for i in model.graph.initializer}
    init |= {n.output[0]: a.t for n in model.graph.node if n.op_type == "Constant"
             for a in n.attribute if a.name == "value"}
    topk = [n for n in model.graph.node if n.op_type == "TopK"]
    names = BANK + (COARSE if topk else ())
    consts = {k: numpy_helper.to_array(init[k]).astype(np.float32) for k in names}
    k = int(numpy_helper.to_array(init[topk[0].input[1]]).reshape(-1)[0]) if topk else 0
    return consts, k


def _trunk_savedmodel(fp32: Path, tmp: Path) -> Any:
    """The feature trunk of ``fp32`` as a TensorFlow signature ``image -> (B, G, G, C)``."""
    import onnx  # noqa: PLC0415
    import onnx.utils  # noqa: PLC0415
    import onnx2tf  # noqa: PLC0415
    import onnxsim  # noqa: PLC0415
    import tensorflow as tf  # noqa: PLC0415

    model = onnx.load(str(fp32))
    trunk = tmp / "trunk.onnx"
    onnx.utils.extract_model(str(fp32), str(trunk), [model.graph.input[0].name],
                             [features_output(model)])
    simple, ok = onnxsim.simplify(onnx.load(str(trunk)))
    if not ok:
        raise RuntimeError("onnxsim could not validate the simplified trunk")
    onnx.save(simple, str(trunk))
    onnx2tf.convert(input_onnx_file_path=str(trunk), output_folder_path=str(tmp / "saved"),
                    keep_shape_absolutely_input_names=[model.graph.input[0].name],
                    not_use_onnxsim=True, output_signaturedefs=True, non_verbose=True)
    return tf.saved_model.load(str(tmp / "saved")).signatures["serving_default"]


def _head(consts: dict[str, np.ndarray], shortlist: int) -> Callable[[Any], Any]:
    """The kNN head in TensorFlow: features ``(B, G, G, C)`` -> score ``(B,)``
    (``mtd_patchcore.full_model``'s ``forward``, with the same coarse-to-fine search)."""
    import tensorflow as tf  # noqa: PLC0415

    c = int(consts["bank_mu"].shape[0])
    t = {k: tf.constant(v) for k, v in consts.items()}

    def head(f: Any) -> Any:
        z = tf.reshape(f, [tf.shape(f)[0], -1, c]) - t["bank_mu"]  # (B, P, C)
        zz = tf.reduce_sum(tf.multiply(z, z, name="zz_sq"), 2, name="zz")
        if shortlist:
            d2c = tf.add(tf.reduce_min(tf.matmul(z, t["coarse_w"]) + t["coarse_sq"], 2,
                                       name="d2c_min"), zz, name="d2c")
            idx = tf.math.top_k(d2c, min(shortlist, int(f.shape[1]) * int(f.shape[2]))).indices
            z = tf.gather(z, idx, batch_dims=1, name="z_short")
            zz = tf.gather(zz, idx, batch_dims=1, name="zz_short")
        d2 = tf.add(tf.reduce_min(tf.matmul(z, t["bank_w"]) + t["bank_sq"], 2, name="d2_min"),
                    zz, name="d2")
        return tf.sqrt(tf.maximum(tf.reduce_max(d2, 1, name="d2_max"), 0.0, name="d2_pos"),
                       name="score")

    return head


def tflite_int8(package_dir: Path, out_path: Path, calib_images: np.ndarray) -> dict[str, str]:
    """Write the TFLite INT8 artefact of the package's ``model.fp32.onnx`` to ``out_path``.

    Args:
        package_dir: A package directory with ``model.fp32.onnx`` (``mtd_patchcore.full_model``
            exported by ``mtd_patchcore.export``).
        out_path: The ``.tflite`` file to write.
        calib_images: ``(N, 1, S, S)`` float32 preprocessed images (``load_gray`` +
            ``normalise``): the representative dataset, one image per step. The recipe's
            OpenVINO calibration images (all fit images) suit.

    Returns:
        Tool versions and the method, for the manifest's lineage.

    Raises:
        ImportError: TensorFlow, onnx2tf or onnxsim is not installed (the recipe notes it and
            skips the artefact).
    """
    import onnx  # noqa: PLC0415
    import onnx2tf  # noqa: PLC0415
    import onnxsim  # noqa: PLC0415
    import tensorflow as tf  # noqa: PLC0415

    fp32 = package_dir / "model.fp32.onnx"
    consts, shortlist = head_constants(onnx.load(str(fp32)))
    x = np.ascontiguousarray(calib_images, dtype=np.float32)
    with tempfile.TemporaryDirectory() as tmp:
        trunk = _trunk_savedmodel(fp32, Path(tmp))
        head = _head(consts, shortlist)
        spec = tf.TensorSpec([None, *x.shape[1:]], tf.float32, name="image")

        @tf.function(input_signature=[spec])  # type: ignore[untyped-decorator]
        def model(image: Any) -> Any:
            return head(next(iter(trunk(image=image).values())))

        def representative() -> Iterator[list[np.ndarray]]:
            for i in range(len(x)):
                yield [x[i : i + 1]]

        conv = tf.lite.TFLiteConverter.from_concrete_functions(
            [model.get_concrete_function()], model)
        conv.optimizations = [tf.lite.Optimize.DEFAULT]
        conv.representative_dataset = representative
        conv.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8,
                                          tf.lite.OpsSet.TFLITE_BUILTINS]
        debugger = tf.lite.experimental.QuantizationDebugger(
            converter=conv, debug_dataset=lambda: iter([[x[:1]]]),
            debug_options=tf.lite.experimental.QuantizationDebugOptions(
                denylisted_nodes=list(FLOAT_HEAD)))
        flat = debugger.get_nondebug_quantized_model()
    _check_float_score(tf, flat)
    out_path.write_bytes(flat)
    return {"tensorflow": str(tf.__version__), "onnx2tf": str(onnx2tf.__version__),
            "onnxsim": str(onnxsim.__version__),
            "method": "onnx2tf trunk + TensorFlow kNN head; TFLiteConverter full-integer PTQ "
                      f"on {len(x)} images (per-channel int8 weights): trunk and bank products "
                      "int8, distance arithmetic after the products float"}


def _check_float_score(tf: Any, flat: bytes) -> None:
    """Raise RuntimeError unless the score's Sqrt computes in float (else it saturates at the
    largest calibration score)."""
    interp = tf.lite.Interpreter(model_content=flat)
    interp.allocate_tensors()
    tensors = {t["index"]: t for t in interp.get_tensor_details()}
    # _get_ops_details: the interpreter's (private) op list, the only place op types are listed
    sqrt = [o for o in interp._get_ops_details() if o["op_name"] == "SQRT"]
    if not sqrt or any(np.dtype(tensors[o["outputs"][0]]["dtype"]) != np.float32
                       for o in sqrt):
        raise RuntimeError("the score head was quantized (its Sqrt is not float32): the "
                           "deny-list names no longer match the converter's")


def litert_runner(path: Path, threads: int = 2) -> Callable[[np.ndarray], np.ndarray]:
    """A LiteRT interpreter of ``path`` as a function ``(N, 1, S, S) -> (N,)`` float32
    (one image per call, as a camera stream scores)."""
    from ai_edge_litert.interpreter import Interpreter  # noqa: PLC0415

    interp = Interpreter(model_path=str(path), num_threads=threads)
    interp.allocate_tensors()
    inp, out = interp.get_input_details()[0], interp.get_output_details()[0]

    def run(x: np.ndarray) -> np.ndarray:
        scores = []
        for i in range(len(x)):
            interp.set_tensor(inp["index"], np.ascontiguousarray(x[i : i + 1], np.float32))
            interp.invoke()
            scores.append(float(interp.get_tensor(out["index"]).reshape(-1)[0]))
        return np.asarray(scores, np.float32)

    return run


def main(argv: list[str] | None = None) -> int:
    """Build the TFLite artefact of an existing package and print its agreement with FP32."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from mtd_padim import runner  # noqa: PLC0415
    from mtd_patchcore import load_gray, normalise, read_split, split_rows  # noqa: PLC0415

    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--package", type=Path, required=True, help="package with model.fp32.onnx")
    ap.add_argument("--data", type=Path, required=True, help="MTD root (has splits/split.csv)")
    ap.add_argument("--out", type=Path, required=True, help="the .tflite file to write")
    ap.add_argument("--calib", type=int, default=0, help="calibration images (0: all fit)")
    a = ap.parse_args(argv)
    args = json.loads((a.package / "manifest.json").read_text())["lineage"]["args"]
    rows = [r for r in read_split(a.data) if r.split == "train" and r.label == 0]
    fit, val = split_rows(rows, args["val"], args["seed"])
    size = args["size"]
    x_fit = normalise(np.stack([load_gray(a.data / r.image, size) for r in fit]))
    x_val = normalise(np.stack([load_gray(a.data / r.image, size) for r in val]))
    calib = x_fit[np.random.default_rng(args["seed"] + 1).permutation(len(x_fit))
                  [:a.calib or None]]
    t0 = time.perf_counter()
    tools = tflite_int8(a.package, a.out, calib)
    f32 = runner(a.package / "model.fp32.onnx")(x_val)
    err = np.abs(litert_runner(a.out)(x_val) - f32)
    print(json.dumps(tools))
    print(f"wrote {a.out} ({a.out.stat().st_size} B, {time.perf_counter() - t0:.0f} s); "
          f"validation good: LiteRT INT8 vs FP32 |err| max {err.max():.4f} mean "
          f"{err.mean():.4f} (FP32 scores median {np.median(f32):.3f})")
    if a.out.resolve().parent == a.package.resolve():
        add_to_manifest(a.package, a.out, tools, err, len(calib))
        print(f"added {a.out.name} to {a.package / 'manifest.json'}")
    return 0


def add_to_manifest(package_dir: Path, tflite: Path, tools: dict[str, str], err: np.ndarray,
                    calibration_images: int) -> None:
    """List ``tflite`` (a file inside ``package_dir``) in the package's manifest as the
    ``litert``/``int8`` artefact, with its tools and its agreement with FP32 on the validation
    good images (``err``: ``(N,)`` |INT8 - FP32| scores) in the lineage; what the recipe's
    build writes when TensorFlow is installed there.

    Raises:
        ValueError: ``err`` exceeds the largest agreement error the package's golden tolerance
            was set from (``atol_margin`` x that error): the tolerance would have to change,
            so the package must be rebuilt with the recipe instead.
    """
    import hashlib  # noqa: PLC0415

    path = package_dir / "manifest.json"
    manifest = json.loads(path.read_text())
    lineage = manifest["lineage"]
    agreement = lineage["fp32_int8_agreement"]
    worst = max(float(v["max_abs_err"]) for k, v in agreement.items() if isinstance(v, dict))
    if float(err.max()) > worst:
        raise ValueError(f"LiteRT INT8 max |err| {err.max():.4f} exceeds {worst:.4f}, which set "
                         "the golden tolerance: rebuild the package with the recipe")
    manifest["artefacts"] = [x for x in manifest["artefacts"] if x["path"] != tflite.name] + [{
        "runtime": "litert", "precision": "int8", "path": tflite.name,
        "sha256": hashlib.sha256(tflite.read_bytes()).hexdigest(),
        "size_bytes": tflite.stat().st_size}]
    lineage["quantization"]["litert"] = {**tools, "calibration_images": calibration_images}
    agreement["litert"] = {"max_abs_err": round(float(err.max()), 5),
                           "mean_abs_err": round(float(err.mean()), 5)}
    path.write_text(json.dumps(manifest, indent=1) + "\n")


if __name__ == "__main__":
    raise SystemExit(main())
