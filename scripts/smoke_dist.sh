#!/usr/bin/env bash
# Build the wheel and the sdist, install each in a fresh venv (the wheel with its dependencies, the
# sdist over it), and run the installed command: --version, and one extraction with the packaged model.
set -euo pipefail
cd "$(dirname "$0")/.."
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
python -m build --outdir "$work/dist" . >"$work/build.log" 2>&1 || { cat "$work/build.log"; exit 1; }
version="$(python -c 'import tomllib; print(tomllib.load(open("pyproject.toml", "rb"))["project"]["version"])')"
python3 -m venv "$work/venv"
"$work/venv/bin/pip" install -q -c constraints.txt "$work"/dist/layerwise-"$version"-py3-none-any.whl
check() {
    (cd "$work" && "$work/venv/bin/layerwise" --version | grep -qx "layerwise $version") \
        || { echo "smoke_dist: $1 does not report layerwise $version"; exit 1; }
    printf 'The bank raised rates.\nA river bank.\n' >"$work/texts.txt"
    (cd "$work" && "$work/venv/bin/layerwise" extract texts.txt -o out.npz --pool sentence:mean -q)
    "$work/venv/bin/python" -c "import numpy as np; z = np.load('$work/out.npz'); assert z['embeddings'].shape[0] == 2, z.files" \
        || { echo "smoke_dist: $1 extracted nothing"; exit 1; }
    rm -f "$work/out.npz"
}
check wheel
"$work/venv/bin/pip" install -q --no-deps --force-reinstall "$work"/dist/layerwise-"$version".tar.gz
check sdist
echo "smoke_dist: wheel and sdist of layerwise $version install and run"
