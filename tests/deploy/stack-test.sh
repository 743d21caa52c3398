#!/usr/bin/env bash
# `make stack-test`: the compose stack for real. Installs what is missing (Debian's docker.io,
# docker-compose and debootstrap; root and apt), starts dockerd when none answers (and stops
# it again at the end), builds the images (docker/build-images.sh: the service, the sidecar,
# moto's S3 server, Debian's Prometheus), then runs the scenario of
# tests/deploy/stack_docker.py with the virtual environment's pytest. Every wait is bounded; the scenario removes its containers,
# volumes and network even when it fails.
#
# Environment: PYTHON (default .venv/bin/python), STACK_BUILD_TIMEOUT_S (default 900: a
# cold build, base included, took 3 to 6 minutes here), STACK_TEST_TIMEOUT_S (600; the
# scenario took 1 to 2 minutes).
set -euo pipefail
cd "$(dirname "$0")/../.."

PYTHON=${PYTHON:-.venv/bin/python}
log() { echo "stack-test: $*" >&2; }
started=$SECONDS

if ! command -v dockerd >/dev/null || ! command -v debootstrap >/dev/null \
  || { ! command -v docker-compose >/dev/null && ! docker compose version >/dev/null 2>&1; }; then
  if [[ $(id -u) != 0 ]]; then
    log "docker.io, docker-compose and debootstrap are needed (apt-get install, as root)"
    exit 1
  fi
  log "installing docker.io docker-compose debootstrap"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    docker.io docker-compose debootstrap >/dev/null
fi

mkdir -p build
dockerd_pid=""
stop_dockerd() {
  [[ -n $dockerd_pid ]] || return 0
  log "stopping the dockerd this script started (pid $dockerd_pid)"
  kill "$dockerd_pid" 2>/dev/null || true
  for _ in $(seq 60); do
    kill -0 "$dockerd_pid" 2>/dev/null || return 0
    sleep 0.5
  done
  kill -9 "$dockerd_pid" 2>/dev/null || true
}
trap stop_dockerd EXIT

# dockerd with the given storage driver, waited on for up to 60 s.
start_dockerd() {
  local driver=$1
  log "starting dockerd (storage driver $driver; log build/dockerd.log)"
  setsid dockerd --storage-driver="$driver" >>build/dockerd.log 2>&1 </dev/null &
  dockerd_pid=$!
  for _ in $(seq 120); do
    if docker info >/dev/null 2>&1; then
      return 0
    fi
    if ! kill -0 "$dockerd_pid" 2>/dev/null; then
      dockerd_pid=""
      return 1
    fi
    sleep 0.5
  done
  stop_dockerd
  dockerd_pid=""
  return 1
}

if ! docker info >/dev/null 2>&1; then
  if [[ $(id -u) != 0 ]]; then
    log "no Docker engine answers, and starting one needs root"
    exit 1
  fi
  start_dockerd overlay2 || start_dockerd vfs || {
    tail -n 30 build/dockerd.log >&2
    log "dockerd did not start"
    exit 1
  }
fi
log "engine: $(docker version --format 'server {{.Server.Version}}' 2>/dev/null)"

build_started=$SECONDS
timeout "${STACK_BUILD_TIMEOUT_S:-900}" docker/build-images.sh server sidecar moto prometheus
log "images built in $((SECONDS - build_started)) s"

status=0
timeout -k 30 "${STACK_TEST_TIMEOUT_S:-600}" \
  "$PYTHON" -m pytest -q -s -p no:cacheprovider tests/deploy/stack_docker.py || status=$?
if [[ $status == 124 || $status == 137 ]]; then
  log "the scenario ran past ${STACK_TEST_TIMEOUT_S:-600} s; removing what it left"
  "$PYTHON" -m tests.deploy.stack_docker --down || true
fi
log "done in $((SECONDS - started)) s (exit $status)"
exit "$status"
