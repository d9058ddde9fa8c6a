"""A digital twin of SLED and of the centralized server: a discrete-event model (SimPy) that
takes a playbook the lab runs and writes the run folder a lab run would, marked simulated."""
