"""The report of what a stream runs, sent once when the model updater starts.

A gateway that runs its configured package (a ``builtin:`` one, or a path in the config) has
never reported a model to the fleet, so the fleet cannot know which version an abort of the
first rollout should bring back. The updater's first pass therefore reports, per stream, the
package in force as ``active`` with no rollout (``rollout_id`` None) and ``details.origin``:
``configured`` (the config's package) or ``installed`` (one from the fleet, recorded in
``active.json``). The fleet stores it like any report and records it as the device's model; a
rollout created later keeps it as each device's previous version (see ``docs/rollouts.md``).
"""

from __future__ import annotations

from agent.inference.package import ModelPackage
from cloud_sync.protocol import ModelStatusReport

#: ``details["origin"]`` of the report: the config's package, or one installed from the fleet.
CONFIGURED, INSTALLED = "configured", "installed"


def running_report(
    device_id: str, stream: str, package: ModelPackage, from_fleet: bool, at: float
) -> ModelStatusReport:
    """The ``active`` report of ``package`` running on ``stream``.

    Args:
        device_id: This gateway.
        stream: Stream name.
        package: The package in force on the stream.
        from_fleet: True when it was installed from the fleet (else the configured one).
        at: Epoch seconds UTC.
    """
    m = package.manifest
    return ModelStatusReport(
        device_id=device_id, stream=stream, name=m.name, version=m.version, rollout_id=None,
        state="active", details={"origin": INSTALLED if from_fleet else CONFIGURED}, at=at,
    )
