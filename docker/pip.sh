#!/bin/sh
# pip as the image builds run it: with the build's optional secrets, never kept in a layer.
#   ca.crt     a CA bundle to trust (a proxy that re-signs TLS): PIP_CERT
#   pip.conf   the index settings of the machine that builds (docker/build-images.sh
#              writes it from that machine's pip configuration): PIP_CONFIG_FILE
# Without them, pip uses its defaults (PyPI), as on any machine with open access.
set -eu
if [ -f /run/secrets/ca.crt ]; then
  export PIP_CERT=/run/secrets/ca.crt
fi
if [ -f /run/secrets/pip.conf ]; then
  export PIP_CONFIG_FILE=/run/secrets/pip.conf
fi
exec python -m pip "$@"
