#!/usr/bin/env bash
# A new user's crate on the stable toolchain, outside the workspace: it depends on this checkout
# by path, then on the packaged crates (`cargo package`, the crates.io form, with no kernel
# sources and no nightly), builds from clean and runs the README's example (host/examples/
# quickstart.rs) on the CPU. Prints each clean build's time and dmattn's own share of it.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# The workspace's own settings must not reach the user's build.
unset CARGO_TARGET_DIR RUSTFLAGS RUSTUP_TOOLCHAIN

# user NAME DEPENDENCY [PATCH...]: a `cargo new` crate whose main is the README's example.
user() {
  local name=$1 dir=$work/$1 dep=$2; shift 2
  cargo +stable new --quiet --name user "$dir"
  printf 'dmattn = %s\n' "$dep" >> "$dir/Cargo.toml"
  if [ $# -gt 0 ]; then printf '\n[patch.crates-io]\n' >> "$dir/Cargo.toml"; printf '%s\n' "$@" >> "$dir/Cargo.toml"; fi
  cp "$repo/host/examples/quickstart.rs" "$dir/src/main.rs"
  (
    cd "$dir"
    start=$(date +%s%N)
    cargo +stable build --quiet
    total=$(( ($(date +%s%N) - start) / 1000000 ))
    # dmattn's own share: its build script and crate, rebuilt alone over the cached dependencies.
    cargo +stable clean --quiet -p dmattn
    start=$(date +%s%N)
    cargo +stable build --quiet
    own=$(( ($(date +%s%N) - start) / 1000000 ))
    printf '== %s: clean build %d.%01d s, of which dmattn %d.%01d s (%s cores)\n' "$name" $((total / 1000)) $((total % 1000 / 100)) $((own / 1000)) $((own % 1000 / 100)) "$(nproc)"
    # No GPU here: the example says so and runs on the CPU.
    cargo +stable run --quiet
  )
}

echo "== downstream crate, dmattn by path"
user path "{ path = \"$repo/host\" }"

echo "== downstream crate, dmattn by git (this checkout's HEAD, fetched by cargo)"
user git "{ git = \"file://$repo\" }"

echo "== downstream crate, dmattn packaged"
packages=(dmattn-abi dmattn-ptx-builder dmattn)
(cd "$repo" && cargo +stable package --quiet --no-verify --allow-dirty $(printf -- '-p %s ' "${packages[@]}") --target-dir "$work/target")
mkdir -p "$work/crates"
for p in "${packages[@]}"; do tar -xzf "$work/target/package/$p-0.1.0.crate" -C "$work/crates"; done
# The packaged dmattn must not reach back into the checkout: no kernel sources, its PTX prebuilt.
test ! -e "$work/crates/dmattn-0.1.0/../kernels-gpu"
test -f "$work/crates/dmattn-0.1.0/ptx/dmattn_sm80.ptx.zst"
user packaged '"0.1.0"' \
  "dmattn = { path = \"$work/crates/dmattn-0.1.0\" }" \
  "dmattn-abi = { path = \"$work/crates/dmattn-abi-0.1.0\" }" \
  "dmattn-ptx-builder = { path = \"$work/crates/dmattn-ptx-builder-0.1.0\" }"
