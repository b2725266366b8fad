#!/usr/bin/env bash
# The compute and sandbox tests as an ordinary account (userns mode), run by root:
#   tests/usermode/run.sh [setup|pytest ARGS...]
# Creates the account (DATAREF_TEST_USER, default dataref-user) when missing, gives it a copy
# of this checkout and a venv it owns, built from the system Python (a Python under root's
# home is not readable by other accounts), then runs pytest as that account with a clean
# environment. A pip cache in the account's home keeps repeated runs fast.
set -euo pipefail
cd "$(dirname "$0")/../.."
ACCOUNT="${DATAREF_TEST_USER:-dataref-user}"
SYSTEM_PYTHON=/usr/bin/python3

if [ "$(id -u)" != 0 ]; then
  echo "tests/usermode/run.sh creates an account and must run as root (CI does)" >&2
  exit 2
fi
id "$ACCOUNT" >/dev/null 2>&1 || useradd --create-home --shell /bin/bash "$ACCOUNT"
HOME_DIR="$(getent passwd "$ACCOUNT" | cut -d: -f6)"
COPY="$HOME_DIR/dataref"
as_user() { runuser -u "$ACCOUNT" -- env -i HOME="$HOME_DIR" USER="$ACCOUNT" LANG=C.UTF-8 \
  PATH=/usr/local/bin:/usr/bin:/bin "$@"; }

if ! "$SYSTEM_PYTHON" -c "import ensurepip, venv" 2>/dev/null; then
  apt-get install -y python3-venv >/dev/null 2>&1 || { apt-get update >/dev/null && apt-get install -y python3-venv; }
fi

# A copy of the working tree (tracked and new files, not .venv or outputs), owned by the account.
mkdir -p "$COPY" && chown "$ACCOUNT:" "$COPY"
git ls-files -z --cached --others --exclude-standard | tar --null -T - -cf - \
  | as_user tar -xf - -C "$COPY"

if [ ! -f "$COPY/.venv/.installed" ] || ! cmp -s pyproject.toml "$COPY/.venv/.installed"; then
  as_user rm -rf "$COPY/.venv"
  as_user "$SYSTEM_PYTHON" -m venv "$COPY/.venv"
  as_user "$COPY/.venv/bin/pip" install -q --upgrade pip
  as_user sh -c "cd '$COPY' && .venv/bin/pip install -q -e '.[test]'"
  as_user cp "$COPY/pyproject.toml" "$COPY/.venv/.installed"
fi
[ "${1:-}" = setup ] && exit 0
[ "${1:-}" = pytest ] && shift
as_user sh -c "cd '$COPY' && exec .venv/bin/python -m pytest -p no:cacheprovider \"\$@\"" sh "$@"
