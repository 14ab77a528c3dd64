#!/usr/bin/env bash
# The browser demo's headless test (run by .ci/run): builds the wasm module (build.sh), serves
# examples/web on 127.0.0.1 and opens it in headless Chromium through chromedriver
# (serve.py --test). Fails unless the page reports that the GPU results match the CPU
# reference. Leaves target/web-demo.png (screenshot) and target/web-result.json (the result).
# Needs: chromium, chromium-driver, python3 (Debian packages); arguments go to serve.py.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
"$here/build.sh"
start=$(date +%s)
python3 "$here/serve.py" --test "$@"
echo "== headless test took $(($(date +%s) - start)) s"
