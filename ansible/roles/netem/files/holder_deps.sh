#!/bin/sh
# What compiling the packet holder (holder.c: gcc ... -lnetfilter_queue -lnfnetlink -lm) needs
# and this host lacks; prints one JSON line, {"missing": [...]}, each the thing looked for and
# its Debian package.
missing=""
add() { missing="${missing:+$missing, }\"$1\""; }
has_header() { echo "#include <$1>" | gcc -E -x c - >/dev/null 2>&1; }
if ! command -v gcc >/dev/null 2>&1; then
  add "gcc, the C compiler (gcc)"
else
  has_header stdio.h || add "the C library headers (libc6-dev)"
  has_header libnetfilter_queue/libnetfilter_queue.h \
    || add "libnetfilter_queue/libnetfilter_queue.h (libnetfilter-queue-dev)"
  for lib in netfilter_queue:libnetfilter-queue-dev nfnetlink:libnfnetlink-dev; do
    case "$(gcc -print-file-name="lib${lib%%:*}.so")" in
      /*) ;;
      *) add "lib${lib%%:*}.so (${lib#*:})" ;;
    esac
  done
fi
echo "{\"missing\": [$missing]}"
