#!/usr/bin/env bash
# One formatter for the C sources and the one C++ file: .clang-format at
# the root, clang-format 14 (Debian 12's; another major version may lay
# out a few lines
# differently). `bash scripts/format.sh` rewrites every file in place, new
# ones not yet added to git included;
# `bash scripts/format.sh --check` changes nothing and fails, listing the
# files, when one is not formatted.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v clang-format > /dev/null; then
    if command -v apt-get > /dev/null; then apt-get install -y -q clang-format > /dev/null; fi
fi
command -v clang-format > /dev/null || { echo "format.sh: clang-format is not installed" >&2; exit 2; }
# tracked files and new ones not yet added (not those .gitignore leaves out)
mapfile -t files < <(git ls-files --cached --others --exclude-standard '*.c' '*.h' '*.cpp' |
    grep -v '^tests/fuzz/seeds/')
if [ "${1:-}" = "--check" ]; then
    bad=()
    for f in "${files[@]}"; do
        clang-format --style=file "$f" | cmp -s - "$f" || bad+=("$f")
    done
    if [ ${#bad[@]} -gt 0 ]; then
        printf 'not formatted (run bash scripts/format.sh): %s\n' "${bad[@]}" >&2
        exit 1
    fi
    echo "format: ${#files[@]} files formatted"
else
    clang-format --style=file -i "${files[@]}"
fi
