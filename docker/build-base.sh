#!/usr/bin/env bash
# A base image made from Debian's own packages, for machines that reach Debian's mirror but
# no image registry (so `FROM python:3.11-slim` cannot be pulled): debootstrap's minbase
# variant of bookworm with its python3 (3.11), imported with `docker import`.
#
#   docker/build-base.sh [--force]        # prints the image's name when done
#
# Environment:
#   BASE_IMAGE      the tag to make (default rlreplay-base:bookworm)
#   DEBIAN_MIRROR   the mirror to bootstrap from (default: the first bookworm source of this
#                   machine's apt configuration, else http://deb.debian.org/debian)
#   DOCKER          the docker command (default docker)
#
# The image exists already: nothing is done (--force makes it again). Needs root and
# debootstrap (apt-get install debootstrap).
set -euo pipefail

BASE_IMAGE=${BASE_IMAGE:-rlreplay-base:bookworm}
DOCKER=${DOCKER:-docker}
SUITE=bookworm
# python-is-python3: `python` as in the public image; passwd: groupadd/useradd; libstdc++6:
# the C++ runtime rocksdict's and torch's wheels link against; ca-certificates: TLS to S3.
PACKAGES=python3,python3-venv,python-is-python3,passwd,libstdc++6,ca-certificates

force=0
[[ ${1:-} == --force ]] && force=1

log() { echo "build-base: $*" >&2; }

if [[ $force == 0 ]] && $DOCKER image inspect "$BASE_IMAGE" >/dev/null 2>&1; then
  log "$BASE_IMAGE exists (--force makes it again)"
  echo "$BASE_IMAGE"
  exit 0
fi

# The mirror apt uses here: deb822 sources (URIs: / Suites:) or one-line sources.list.
apt_mirror() {
  local file
  for file in /etc/apt/sources.list.d/*.sources; do
    [[ -f $file ]] || continue
    awk -v suite="$SUITE" '
      /^[[:space:]]*$/ { if (uri != "" && ok) { print uri; exit } uri = ""; ok = 0; next }
      /^URIs:/ { uri = $2 }
      /^Suites:/ { for (i = 2; i <= NF; i++) if ($i == suite) ok = 1 }
      END { if (uri != "" && ok) print uri }
    ' "$file" | grep -v -- '-security' | head -n 1
  done
  for file in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
    [[ -f $file ]] || continue
    awk -v suite="$SUITE" '$1 == "deb" && $0 ~ " " suite " " { for (i = 2; i <= NF; i++) if ($i ~ /^https?:/) { print $i; exit } }' "$file"
  done
}

mirror=${DEBIAN_MIRROR:-$(apt_mirror | grep -v -- '-security' | head -n 1 || true)}
mirror=${mirror:-http://deb.debian.org/debian}

command -v debootstrap >/dev/null || { log "debootstrap is missing: apt-get install debootstrap"; exit 1; }

root=$(mktemp -d "${TMPDIR:-/tmp}/rlreplay-base.XXXXXX")
trap 'rm -rf "$root"' EXIT
log "debootstrap --variant=minbase $SUITE from $mirror"
start=$(date +%s)
debootstrap --variant=minbase --include="$PACKAGES" "$SUITE" "$root" "$mirror" >"$root.log" 2>&1 || {
  tail -n 30 "$root.log" >&2
  rm -f "$root.log"
  exit 1
}
rm -f "$root.log"

# What a container never uses: apt's lists and caches, documentation, locales but C.UTF-8.
rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/* "$root"/usr/share/doc/* \
  "$root"/usr/share/man/* "$root"/usr/share/info/* "$root"/var/log/*
find "$root"/usr/share/locale -mindepth 1 -maxdepth 1 ! -name 'locale.alias' -exec rm -rf {} +

tar -C "$root" -c . | $DOCKER import \
  --change 'ENV LANG=C.UTF-8' \
  --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  --change 'CMD ["python3"]' \
  --message "debootstrap --variant=minbase $SUITE + $PACKAGES" \
  - "$BASE_IMAGE" >/dev/null
log "$BASE_IMAGE made in $(($(date +%s) - start)) s"
echo "$BASE_IMAGE"
