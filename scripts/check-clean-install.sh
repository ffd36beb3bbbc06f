#!/usr/bin/env bash
# What a user gets from `pip install .` alone (no development pins, no torch, no vLLM):
# plan, predict, topo and report must work, and report must write a PDF from a committed run directory.
# Runs in .ci/run after the tests; fails on any undeclared runtime import (ModuleNotFoundError).
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
py=$(command -v python3.11 || command -v python3)
"$py" -m venv "$work/venv"
pip=("$work/venv/bin/pip" -q --disable-pip-version-check)
echo "clean-install: pip install . into a fresh venv ..." >&2
# A copy of the source, so that no build folder lands in the checkout.
git ls-files -z | tar --null -T - -cf - | (mkdir -p "$work/src" && tar -xf - -C "$work/src")
"${pip[@]}" install "$work/src" 2> >(grep -v "^WARNING: Location '.*' is ignored" >&2)
tp="$work/venv/bin/tpcomm"
for forbidden in torch vllm pytest pdfplumber; do
  if "$work/venv/bin/python" -c "import $forbidden" 2>/dev/null; then
    echo "clean-install: $forbidden is importable in the clean venv; the check would not be clean" >&2
    exit 1
  fi
done
cd "$work"
"$tp" plan --model kimi-k2.5 --tp 8 >/dev/null
"$tp" predict --model kimi-k2.5 --tp 8 --gpu rtx-pro-6000 >/dev/null
"$tp" topo >/dev/null
# selfcheck needs torch: one line naming it and exit 2, not a traceback.
set +e; out=$("$tp" selfcheck 2>&1); rc=$?; set -e
if [ "$rc" != 2 ] || ! grep -q "needs torch" <<<"$out" || grep -q Traceback <<<"$out"; then
  echo "clean-install: tpcomm selfcheck without torch: exit $rc: $out" >&2
  exit 1
fi
for run in "$repo"/reports/runs/*/; do
  name=$(basename "$run")
  cp -r "$run" "$work/$name"
  "$tp" report "$work/$name" --out "$work/$name.pdf" >/dev/null
  head -c 5 "$work/$name.pdf" | grep -q '%PDF-' || { echo "clean-install: no PDF for $name" >&2; exit 1; }
  [ -s "$work/$name.md" ] || { echo "clean-install: no Markdown for $name" >&2; exit 1; }
done
# Every tpcomm module that does not need torch/vLLM imports with the declared dependencies alone.
"$work/venv/bin/python" - <<'PY'
import importlib, pkgutil, sys
import tpcomm
# Modules that run inside vLLM or on the ranks (torch/vLLM required by design, installed there).
needs_stack = ("tpcomm.hook.", "tpcomm.tinymodel", "tpcomm.vllm_server")
bad = []
for m in pkgutil.walk_packages(tpcomm.__path__, "tpcomm."):
    if m.name.startswith(needs_stack) or m.name in ("tpcomm.hook",):
        continue
    try:
        importlib.import_module(m.name)
    except ModuleNotFoundError as e:
        if e.name.split(".")[0] not in ("torch", "vllm", "transformers", "tokenizers"):
            bad.append(f"{m.name}: {e}")
if bad:
    print("clean-install: undeclared runtime imports:\n  " + "\n  ".join(bad), file=sys.stderr)
    sys.exit(1)
PY
echo "clean-install: plan, predict, topo, report OK with pip install . alone" >&2
