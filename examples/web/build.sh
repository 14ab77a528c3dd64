#!/usr/bin/env bash
# Builds the browser demo into examples/web/pkg/ (qsa_web.js + qsa_web_bg.wasm) on a Debian
# bookworm machine with a native Rust toolchain but no rustup wasm target:
#
#   1. Debian's rustc-web from bookworm-security (LLVM with the WebAssembly backend), its std
#      sources and its lld, fetched with `apt-get download` and unpacked with `dpkg -x` into
#      examples/web/.toolchain/root (nothing is installed on the system);
#   2. the wasm-bindgen CLI of the exact version in examples/web/Cargo.lock, built once with
#      `cargo install` into examples/web/.toolchain/wasm-bindgen-<version>;
#   3. std + the demo for wasm32-unknown-unknown with that rustc and -Zbuild-std
#      (RUSTC_BOOTSTRAP=1 lets a stable rustc take -Z flags), then `wasm-bindgen --target web`.
#
# Needs: apt lists that include bookworm-security (`apt-get update`), cargo, and the shared
# libraries Debian's LLVM uses (libedit2 libffi8 libxml2 libz3-4 libzstd1; usually present).
# Env: RUST_WEB_VERSION pins the Debian version (e.g. 1.96.0+dfsg1-1~deb12u2; default: the
# candidate apt offers), CARGO (default: cargo).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
tc="$here/.toolchain"
root="$tc/root"
cargo="${CARGO:-cargo}"
msrv=1.87 # wgpu 30 and naga 30

# --- 1. rustc-web ---------------------------------------------------------------------------
if [ ! -x "$root/usr/bin/rustc" ]; then
    echo "== fetching Debian rustc-web (apt-get download, dpkg -x)"
    rm -rf "$tc/debs" "$root"
    mkdir -p "$tc/debs" "$root"
    cd "$tc/debs"
    pin() { if [ -n "${RUST_WEB_VERSION:-}" ]; then echo "$1=$RUST_WEB_VERSION"; else echo "$1"; fi; }
    apt-get download -q "$(pin rustc-web)" "$(pin libstd-rust-web-dev)" \
        "$(pin rust-web-src)" "$(pin rust-web-llvm)"
    # The versioned packages behind them: libstd-rust-web-X.Y, and the LLVM they were built
    # with (libllvmN for rustc's codegen, lld-N as rust-lld, the wasm linker).
    dep() { dpkg-deb -f "$1" Depends | tr ',' '\n' | sed -n "s/^ *\($2\)\( .*\)\?$/\1/p" | head -n1; }
    std=$(dep libstd-rust-web-dev_*.deb 'libstd-rust-web-[0-9.]*')
    llvm=$(dep rust-web-llvm_*.deb 'llvm-[0-9]*')
    [ -n "$std" ] && [ -n "$llvm" ] || { echo "cannot tell the std or LLVM package of rustc-web" >&2; exit 1; }
    apt-get download -q "$std" "libllvm${llvm#llvm-}" "lld-${llvm#llvm-}"
    for deb in *.deb; do dpkg -x "$deb" "$root"; done
    cd "$here"
fi
# Debian's rustc, its LLVM and its lld (rust-lld -> lld-N), for the wasm build only.
web_env=(
    LD_LIBRARY_PATH="$root/usr/lib/x86_64-linux-gnu:$root/usr/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    PATH="$root/usr/bin:$PATH"
    RUSTC="$root/usr/bin/rustc"
    RUSTC_BOOTSTRAP=1
)
have=$(env "${web_env[@]}" "$root/usr/bin/rustc" --version | awk '{print $2}')
if [ "$(printf '%s\n%s\n' "$msrv" "$have" | sort -V | head -n1)" != "$msrv" ]; then
    echo "rustc-web $have is older than $msrv (wgpu 30); bookworm's own 1.85 is too old," >&2
    echo "the bookworm-security one (1.96) works: check apt-cache policy rustc-web" >&2
    exit 1
fi
echo "== $(env "${web_env[@]}" "$root/usr/bin/rustc" --version), $(env "${web_env[@]}" "$root/usr/bin/rust-lld" -flavor wasm --version)"

# --- 2. wasm-bindgen CLI --------------------------------------------------------------------
wb_version=$(sed -n '/^name = "wasm-bindgen"$/{n;s/^version = "\(.*\)"$/\1/p}' "$here/Cargo.lock")
wb="$tc/wasm-bindgen-$wb_version/bin/wasm-bindgen"
if [ ! -x "$wb" ]; then
    echo "== cargo install wasm-bindgen-cli $wb_version (once; with the native toolchain)"
    start=$(date +%s)
    "$cargo" install -q wasm-bindgen-cli --version "$wb_version" --root "$tc/wasm-bindgen-$wb_version"
    echo "== wasm-bindgen-cli took $(($(date +%s) - start)) s"
fi

# --- 3. the demo ----------------------------------------------------------------------------
echo "== cargo build --target wasm32-unknown-unknown -Zbuild-std (std + wgpu + the library)"
start=$(date +%s)
env "${web_env[@]}" "$cargo" build --release --locked --manifest-path "$here/Cargo.toml" \
    --target wasm32-unknown-unknown -Zbuild-std=std,panic_abort
echo "== wasm build took $(($(date +%s) - start)) s"
"$wb" --target web --no-typescript --out-dir "$here/pkg" \
    "$here/target/wasm32-unknown-unknown/release/qsa_web.wasm"
ls -l "$here/pkg"
