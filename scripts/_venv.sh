# Sourced by quickstart.sh and test.sh: make sure $ROOT/.venv exists with the pinned torch.
#   PYTHON=python3.12      the interpreter that creates the venv (default python3)
#   TORCH_SPEC=...         the torch requirement (default torch==2.13.0, the CPU wheel here;
#                          an unpinned `torch` could pull a multi-GB CUDA build)
# Sets VENV and PY.
PYTHON="${PYTHON:-python3}"
TORCH_SPEC="${TORCH_SPEC:-torch==2.13.0}"
VENV="$ROOT/.venv"
PY="$VENV/bin/python"

if [[ -e "$VENV" && ! -d "$VENV" ]]; then
    # A PEP 832 redirect file (tox writes one pointing into .tox/): not ours to keep.
    if grep -qs '^\.tox/' "$VENV"; then
        rm -f "$VENV"
    else
        echo "error: $VENV exists but is not a directory; move it away and re-run." >&2
        exit 1
    fi
fi

if [[ ! -x "$PY" ]]; then
    echo "==> creating $VENV with $PYTHON"
    "$PYTHON" -m venv "$VENV"
fi

if "$PY" -m pip show torch >/dev/null 2>&1; then
    echo "==> torch already installed: $("$PY" -m pip show torch | sed -n 's/^Version: //p')"
else
    echo "==> installing $TORCH_SPEC"
    "$PY" -m pip install "$TORCH_SPEC"
fi
