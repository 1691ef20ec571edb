"""The Backend role: run one model artefact on a batch of inputs.

One module per runtime (:mod:`~agent.inference.onnxruntime`, :mod:`~agent.inference.openvino`,
:mod:`~agent.inference.litert`), each laid out the same way: a ``KIND`` constant, a config class,
the implementation. The runtime library is imported inside the implementation's constructor, so
a runtime loads only when a stream uses it; :mod:`agent.inference.registry` names them, one line
each. A runtime that is not installed raises :class:`~agent.errors.BackendUnavailable` naming the
extra to install.
"""

from __future__ import annotations

from typing import Protocol

from agent.records import Float32Array

#: The extra that installs each runtime (``pip install 'edge-anomaly-agent[<extra>]'``).
EXTRAS = {"onnxruntime": None, "openvino": "openvino", "litert": "litert"}


def install_hint(kind: str) -> str:
    """What to run to install the runtime ``kind``.

    >>> install_hint("openvino")
    "pip install 'edge-anomaly-agent[openvino]'"
    >>> install_hint("onnxruntime")
    'pip install onnxruntime'
    """
    extra = EXTRAS.get(kind)
    if extra is None:
        return f"pip install {kind}"
    return f"pip install 'edge-anomaly-agent[{extra}]'"


def check_input_shape(shape: tuple[int, ...], expected: tuple[int | None, ...]) -> str | None:
    """Why an input of ``shape`` does not fit a model input declared ``expected``, or None.

    ``None`` (or a negative number) in ``expected`` is a dynamic dimension (the batch).

    >>> check_input_shape((2, 10, 8), (None, 10, 8)) is None
    True
    >>> check_input_shape((2, 11, 8), (-1, 10, 8))
    'input shape (2, 11, 8) does not fit the model input (?, 10, 8)'
    """
    fits = len(shape) == len(expected) and all(
        e is None or e < 0 or s == e for s, e in zip(shape, expected, strict=True))
    if fits:
        return None
    want = ", ".join("?" if e is None or e < 0 else str(e) for e in expected)
    return f"input shape {tuple(shape)} does not fit the model input ({want})"


class Backend(Protocol):
    """A loaded model artefact.

    Attributes:
        name: Runtime name for metrics: ``onnxruntime``, ``openvino`` or ``litert``.
        precision: ``int8`` or ``fp32``.
    """

    name: str
    precision: str

    def run(self, windows: Float32Array) -> Float32Array:
        """Run the model.

        Args:
            windows: float32, scaled inputs: ``(B, W, C)`` windows of a sensor model, or
                ``(B, H, W, Ch)`` images of an image model; any batch size B ≥ 1.

        Returns:
            Shape ``(B, F)``, float32 model outputs, row i for input i.

        Raises:
            agent.errors.ModelError: the runtime failed on this input (wrong shape ...).
        """
        ...

    def close(self) -> None:
        """Free the runtime's session, its threads and buffers (at shutdown, after the last
        :meth:`run`); later calls of :meth:`run` raise :class:`~agent.errors.ModelError`.
        Calling it again does nothing."""
        ...
