"""The platform seams: one small module per OS service (folders, stop signals, locks, private files,
the local control transport, process identity), so that nothing above this package is Linux-only.
Each keeps today's POSIX behaviour exactly and has a real Windows branch; callers import the module
they need (``from vcam.platform import folders``), never an OS module directly."""

import os

#: True on Windows (CPython's ``os.name == "nt"``): the one place the seams branch on the OS.
WINDOWS = os.name == "nt"
