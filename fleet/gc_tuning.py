"""The serving process's cyclic garbage collector, set once the app is built.

:func:`settle` runs after :func:`fleet.app.create_app` in every serving process (``edge-fleet
serve``, each ``--workers`` worker):

* ``gc.freeze()``: everything imported and built so far lives as long as the process; moved out
  of the collector's generations, the collections a large ingest batch triggers (tens of
  thousands of fresh dicts) scan only new objects (about 70 ms less per 5,000-record batch).
* Full (oldest-generation) collections at most every :data:`FULL_EVERY` collections of the
  middle generation instead of every 10. Each full collection holds the GIL, so it stops the
  event loop and every request of the process at once; a replica serving 200 requests/s ran one
  about every 10 s, of 25-35 ms of CPU each (66-112 ms of wall time on a busy machine). What
  survives into the oldest generation is long-lived (token cache entries, pooled connections,
  compiled statements): a full collection there found 0-33 unreachable objects, so collecting
  it 10 times less often costs no measurable memory. The young generations keep Python's
  defaults (700 allocations, 10 young collections per middle one): short-lived cycles
  (exceptions with their tracebacks, finished tasks) are still freed within moments.
"""

from __future__ import annotations

import gc

#: Middle-generation collections between two full ones (Python's default: 10).
FULL_EVERY = 100


def settle() -> None:
    """Freeze the objects alive now and make full collections rare (module docstring)."""
    gc.freeze()
    young, middle, _full = gc.get_threshold()
    gc.set_threshold(young, middle, FULL_EVERY)
