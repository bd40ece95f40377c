#!/usr/bin/env bash
# Prints a working python3.12 interpreter. pyenv shims on PATH answer "command not found"
# unless 3.12 is an active pyenv version, so try the shim, then pyenv's own install.
set -u
if python3.12 -c 'import sys' >/dev/null 2>&1; then
  command -v python3.12
  exit 0
fi
for v in $(pyenv versions --bare 2>/dev/null | grep '^3\.12' | sort -rV); do
  p="$(pyenv root)/versions/$v/bin/python3.12"
  if "$p" -c 'import sys' >/dev/null 2>&1; then echo "$p"; exit 0; fi
done
for p in /usr/bin/python3.12 /usr/local/bin/python3.12; do
  if [ -x "$p" ]; then echo "$p"; exit 0; fi
done
echo "error: no working python3.12 found (megatron-core 0.19.2 needs Python 3.12)" >&2
exit 1
