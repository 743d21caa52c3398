#!/usr/bin/env bash
# Builds the images with BuildKit: `make images` runs this from the repository root.
#
#   docker/build-images.sh [server] [sidecar] [moto]     # default: server sidecar
#
#   server   rlreplay:latest           docker/Dockerfile (no torch)
#   sidecar  rlreplay-sidecar:latest   docker/Dockerfile.sidecar
#   moto     rlreplay-moto:test        tests/deploy/Dockerfile.moto (the stack test's S3)
#   prometheus  rlreplay-prometheus:test  tests/deploy/Dockerfile.prometheus (Debian's package,
#            for the stack test)
#
# Everything below is optional; the defaults build as on any machine with open access.
#   BASE_IMAGE         the Python 3.11 base. Default: python:3.11-slim when it is here or can
#                      be pulled; otherwise (no registry reachable) rlreplay-base:bookworm,
#                      made by docker/build-base.sh from Debian's packages.
#   RUNTIME_IMAGE      the sidecar's runtime base. Default: the PyTorch CUDA image with the
#                      public base, BASE_IMAGE otherwise.
#   TORCH_REQUIREMENT  torch for a runtime base without it (default torch==2.13.0 then).
#   CA_BUNDLE          a CA bundle pip trusts during the build (a BuildKit secret, in no
#                      layer). Default: pip's own `cert` setting or PIP_CERT, if any.
#   PIP_CONF_FOR_BUILD a pip.conf for the build (a secret too). Default: written from this
#                      machine's pip configuration: index-url, extra-index-url (http and https
#                      only: a file:// index is not in the build), find-links folders (their
#                      wheels are linked into docker/wheels/, mounted at /wheels).
#   DOCKER             the docker command. Default: the first `docker` on PATH that can build
#                      with BuildKit (has buildx, or is a client older than 23 with BuildKit
#                      built in, such as Debian bookworm's docker.io).
# Prints each image's build time and size; the full build log goes to build/images/*.log.
set -euo pipefail
cd "$(dirname "$0")/.."

log() { echo "build-images: $*" >&2; }

pick_docker() {
  local candidate version seen=""
  for candidate in $(type -ap docker); do
    candidate=$(readlink -f "$candidate")
    [[ " $seen " == *" $candidate "* ]] && continue
    seen="$seen $candidate"
    if "$candidate" buildx version >/dev/null 2>&1; then
      echo "$candidate"
      return
    fi
    version=$("$candidate" version --format '{{.Client.Version}}' 2>/dev/null || true)
    if [[ $version =~ ^([0-9]+)\. ]] && ((BASH_REMATCH[1] < 23)); then
      echo "$candidate"
      return
    fi
  done
  log "no docker client here builds with BuildKit: install docker's buildx plugin (or docker.io)"
  exit 1
}

DOCKER=${DOCKER:-$(pick_docker)}
export DOCKER DOCKER_BUILDKIT=1
PUBLIC_BASE=python:3.11-slim

if [[ -z ${BASE_IMAGE:-} ]]; then
  if $DOCKER image inspect "$PUBLIC_BASE" >/dev/null 2>&1 \
    || timeout 60 $DOCKER pull -q "$PUBLIC_BASE" >/dev/null 2>&1; then
    BASE_IMAGE=$PUBLIC_BASE
  else
    log "$PUBLIC_BASE cannot be pulled here: a base from Debian's packages instead"
    BASE_IMAGE=$(docker/build-base.sh)
  fi
fi
if [[ -z ${RUNTIME_IMAGE:-} && $BASE_IMAGE != "$PUBLIC_BASE" ]]; then
  RUNTIME_IMAGE=$BASE_IMAGE
  TORCH_REQUIREMENT=${TORCH_REQUIREMENT:-torch==2.13.0}
fi

mkdir -p build/images
secrets=()
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# pip's settings on this machine, as `pip config list` and the environment give them.
pip_setting() {
  local name=$1 env=$2 value
  value=${!env:-}
  if [[ -z $value ]]; then
    value=$(python3 -m pip config get "global.$name" 2>/dev/null || true)
  fi
  echo "$value"
}

ca=${CA_BUNDLE:-$(pip_setting cert PIP_CERT)}
if [[ -n $ca && -f $ca ]]; then
  secrets+=(--secret "id=ca.crt,src=$ca")
fi

pip_conf=${PIP_CONF_FOR_BUILD:-}
if [[ -z $pip_conf ]]; then
  pip_conf=$work/pip.conf
  index=$(pip_setting index-url PIP_INDEX_URL)
  extra=$(pip_setting extra-index-url PIP_EXTRA_INDEX_URL)
  links=$(pip_setting find-links PIP_FIND_LINKS)
  find docker/wheels -mindepth 1 ! -name .gitignore -delete
  {
    echo "[global]"
    [[ $index == http* ]] && echo "index-url = $index"
    urls=""
    for url in $extra; do
      if [[ $url == http* ]]; then urls="$urls $url"; else log "left out of the build: index $url"; fi
    done
    [[ -n $urls ]] && echo "extra-index-url =$urls"
    found=""
    for link in $links; do
      link=${link#file://}
      if [[ -d $link ]]; then
        # Hard links where the folder shares the file system, else copies.
        cp -l "$link"/*.whl docker/wheels/ 2>/dev/null || cp "$link"/*.whl docker/wheels/ 2>/dev/null || true
        found=1
      elif [[ $link == http* ]]; then
        echo "find-links = $link"
      fi
    done
    [[ -n $found ]] && echo "find-links = /wheels"
    true
  } >"$pip_conf"
fi
secrets+=(--secret "id=pip.conf,src=$pip_conf")

build() {
  local name=$1 tag=$2 dockerfile=$3
  shift 3
  local started=$SECONDS
  log "$tag: building ($dockerfile, base $BASE_IMAGE)"
  if ! $DOCKER build --progress=plain -f "$dockerfile" -t "$tag" \
    --build-arg "BASE_IMAGE=$BASE_IMAGE" "${secrets[@]}" "$@" . >"build/images/$name.log" 2>&1; then
    tail -n 40 "build/images/$name.log" >&2
    log "$tag: the build failed (build/images/$name.log)"
    exit 1
  fi
  local size
  size=$($DOCKER image inspect -f '{{.Size}}' "$tag")
  log "$tag: built in $((SECONDS - started)) s, $((size / 1000000)) MB"
}

targets=("$@")
[[ ${#targets[@]} -gt 0 ]] || targets=(server sidecar)
for target in "${targets[@]}"; do
  case $target in
    server) build server rlreplay:latest docker/Dockerfile ;;
    sidecar)
      args=()
      [[ -n ${RUNTIME_IMAGE:-} ]] && args+=(--build-arg "RUNTIME_IMAGE=$RUNTIME_IMAGE")
      [[ -n ${TORCH_REQUIREMENT:-} ]] && args+=(--build-arg "TORCH_REQUIREMENT=$TORCH_REQUIREMENT")
      build sidecar rlreplay-sidecar:latest docker/Dockerfile.sidecar "${args[@]}"
      ;;
    moto) build moto rlreplay-moto:test tests/deploy/Dockerfile.moto ;;
    prometheus) build prometheus rlreplay-prometheus:test tests/deploy/Dockerfile.prometheus ;;
    *) log "unknown image $target (server, sidecar, moto, prometheus)"; exit 2 ;;
  esac
done
