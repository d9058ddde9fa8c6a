"""A user's mode on the hybrid server."""

UNSERVED, AD, SD = 0, 1, 2
MODE_NAMES = {UNSERVED: "unserved", AD: "AD", SD: "SD"}
