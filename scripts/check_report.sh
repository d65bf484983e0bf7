#!/usr/bin/env bash
# Renders an HTML report (`mixprec run ... --report REPORT.html`) with headless Chromium to a
# PNG screenshot, for a person to look at. Not part of the test suite (CI has no Chromium; the
# tests check the HTML's structure instead).
#
#   bash scripts/check_report.sh REPORT.html OUT.png [WIDTH [HEIGHT]]
#
# Needs Chromium (Debian: `apt-get install chromium`). Refuses a report that references any
# remote resource, since the report must be self-contained; networking is off while rendering.
set -euo pipefail
if [ $# -lt 2 ]; then
  echo "usage: $0 REPORT.html OUT.png [WIDTH [HEIGHT]]" >&2
  exit 2
fi
report=$1
out=$2
width=${3:-1200}
height=${4:-2000}
[ -f "$report" ] || { echo "error: $report: no such file" >&2; exit 2; }
browser=""
for b in chromium chromium-browser google-chrome; do
  if command -v "$b" >/dev/null 2>&1; then browser=$(command -v "$b"); break; fi
done
[ -n "$browser" ] || { echo "error: Chromium not found (Debian: apt-get install chromium)" >&2; exit 2; }
remote='<[^>]*[[:space:]](src|href)[[:space:]]*=|https?://|url\(|@import'
if grep -Eqi "$remote" "$report"; then
  echo "error: $report references an external resource:" >&2
  grep -Eoi ".{0,30}($remote).{0,40}" "$report" | head -5 >&2
  exit 1
fi
profile=$(mktemp -d)
trap 'rm -rf "$profile"' EXIT
abs_report=$(realpath "$report")
mkdir -p "$(dirname "$out")"
abs_out=$(realpath "$out")
rm -f "$abs_out"
"$browser" --headless --no-sandbox --disable-gpu --disable-quic --no-first-run \
  --disable-background-networking --disable-component-update --disable-sync \
  --disable-extensions --hide-scrollbars --user-data-dir="$profile" \
  --window-size="$width,$height" --screenshot="$abs_out" "file://$abs_report" \
  >"$profile/chromium.log" 2>&1 || { cat "$profile/chromium.log" >&2; exit 1; }
[ -s "$abs_out" ] || { echo "error: no screenshot written" >&2; cat "$profile/chromium.log" >&2; exit 1; }
echo "$abs_out"
