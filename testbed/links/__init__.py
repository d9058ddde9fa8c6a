"""Link impairment of the device <-> server links and its measurement: tc netem or the
userspace NFQUEUE packet holder (`api` applies and clears a lab's links with the right
backend), the probe that measures them (`probe`), and calibration against their profiles."""
