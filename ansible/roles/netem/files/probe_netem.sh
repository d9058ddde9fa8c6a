#!/bin/sh
# Can this host's kernel impair a link with tc netem, and redirect ingress through ifb?
# Tries both on objects it makes and removes at once; prints one JSON line.
netem=false
ifb=false
if tc qdisc add dev lo root handle 1: netem delay 0ms 2>/dev/null; then
  netem=true
  tc qdisc del dev lo root 2>/dev/null
fi
if ip link add tbifbprobe type ifb 2>/dev/null; then
  ifb=true
  ip link del tbifbprobe 2>/dev/null
fi
echo "{\"sch_netem\": $netem, \"ifb\": $ifb}"
