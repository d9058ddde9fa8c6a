"""BALANCE serving: AD and SD users in one engine loop, compute split by time share."""
