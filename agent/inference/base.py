"""The Backend role: run one model artefact on a batch of windows.

One module per runtime (``onnxruntime`` now; OpenVINO and LiteRT later), each with the same shape:
a ``KIND`` constant, then the implementation, imported lazily so a runtime loads only when used.
"""

from __future__ import annotations

from typing import Protocol

from agent.records import Float32Array


class Backend(Protocol):
    """A loaded model artefact.

    Attributes:
        name: Runtime name for metrics, e.g. ``onnxruntime``.
        precision: ``int8`` or ``fp32``.
    """

    name: str
    precision: str

    def run(self, windows: Float32Array) -> Float32Array:
        """Run the model.

        Args:
            windows: Shape ``(B, W, C)``, float32, scaled inputs.

        Returns:
            Shape ``(B, F)``, float32 model outputs.

        Raises:
            agent.errors.ModelError: the runtime failed on this input.
        """
        ...
