"""Host-side agents of the testbed: what is deployed onto devices and servers.

Nothing in this package may import `testbed` (the controller): it must stay small enough to
install on a Raspberry Pi with only llama-cpp-python and numpy.
"""

__version__ = "0.1.0"
