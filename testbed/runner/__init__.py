"""The experiment runner: playbook -> conditions -> lab, link, agents, records."""
