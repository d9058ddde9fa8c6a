"""Speculative decoding core: the acceptance rule and the AD/SD decoding loops."""
