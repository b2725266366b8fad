#!/usr/bin/env bash
# Installs Jupyter Kernel Gateway and Jupyter Enterprise Gateway into venvs of their own under
# .gateways/ (Enterprise Gateway pins an older jupyter_server, so it cannot share a venv).
# The gateways launch the `dataref` kernelspec, which runs dataref's own Python in the sandbox;
# tests/gateways/servers.py starts and stops them.
set -euo pipefail
cd "$(dirname "$0")/../.."
PYTHON="${PYTHON:-python3}"
mkdir -p .gateways
install() {  # venv, pip requirement
  if [ ! -x ".gateways/$1/bin/python" ] || ! ".gateways/$1/bin/python" -c "import sys" 2>/dev/null; then
    "$PYTHON" -m venv ".gateways/$1"
  fi
  if [ ! -f ".gateways/$1/.installed-$2" ]; then
    ".gateways/$1/bin/python" -m pip install -q --upgrade pip
    ".gateways/$1/bin/python" -m pip install -q "$2"
    touch ".gateways/$1/.installed-$2"
  fi
}
install kg "jupyter_kernel_gateway==3.0.1"
install eg "jupyter_enterprise_gateway==3.3.0"
echo "gateways installed: $(.gateways/kg/bin/jupyter-kernelgateway --version 2>/dev/null | tail -1) (kg)," \
  "$(.gateways/eg/bin/jupyter-enterprisegateway --version 2>/dev/null | tail -1) (eg)"
