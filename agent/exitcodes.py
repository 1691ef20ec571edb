"""Process exit codes of ``edge-agent`` (the BSD ``sysexits.h`` values where one fits).

=====  ==================  ==================================================================
code   name                when
=====  ==================  ==================================================================
0      ``EX_OK``           success; ``run``: stopped by a signal, or every source reached the
                           end of its finite input (a replay file, a video file, an image
                           folder)
1      ``EX_FAILURE``      any other failure (a model that fails its checks, the store)
69     ``EX_UNAVAILABLE``  ``run``: every source has ended and at least one of them failed for
                           good (a video file that does not open or holds no readable frame, a
                           source that raised a fatal error); systemd's ``Restart=on-failure``
                           restarts the unit
78     ``EX_CONFIG``       invalid configuration, or ``agent.metrics_port`` already in use
                           (``RestartPreventExitStatus=78``: no restart loop on a broken
                           config)
130    ``EX_INTERRUPTED``  Ctrl-C outside ``run``'s own signal handling
=====  ==================  ==================================================================
"""

from __future__ import annotations

EX_OK = 0
EX_FAILURE = 1
#: sysexits.h EX_UNAVAILABLE: an input the agent depends on is gone for good.
EX_UNAVAILABLE = 69
#: sysexits.h EX_CONFIG.
EX_CONFIG = 78
EX_INTERRUPTED = 130
