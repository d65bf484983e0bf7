#!/usr/bin/env bash
# Renders an HTML report (`mixprec run ... --report`, `mixprec debug precision ... --report`)
# with headless Chromium, the way a person sees it.
#
#   bash scripts/check_report.sh REPORT.html OUT.png [WIDTH [HEIGHT]]
#       a PNG screenshot (scrollbars shown, so a table that scrolls looks like one)
#   bash scripts/check_report.sh --check [--passing] REPORT.html [WIDTH [HEIGHT]]
#       checks the rendered layout and prints what it measured, one `key=value` a line:
#         page_overflow  pixels the page is wider than the window (must be 0)
#         clipped        tables and charts that run past the window's right edge outside a
#                        horizontally scrolling box (must be 0)
#         scrolling      tables that are wider than the window and scroll inside their box
#         layer_tables / layer_tables_without_cause
#                        tables with a `growth` column, and those without a `cause` column
#                        (must be 0)
#         verdict / red_failed
#                        the verdict banner's class, and red FAILED marks (badges, banner,
#                        table cells); with --passing the verdict must be `verdict pass` and
#                        there must be no red FAILED anywhere
#       exits 1 when a check fails. tests/integration/report.rs runs it when Chromium is
#       installed (the suite skips it otherwise, and checks the HTML's structure instead).
#
# Needs Chromium (Debian: `apt-get install chromium`). Refuses a report that references any
# remote resource, since the report must be self-contained; networking is off while rendering.
set -euo pipefail
check=0
passing=0
while [ $# -gt 0 ]; do
  case $1 in
    --check) check=1; shift ;;
    --passing) passing=1; shift ;;
    *) break ;;
  esac
done
if { [ $check = 0 ] && [ $# -lt 2 ]; } || { [ $check = 1 ] && [ $# -lt 1 ]; }; then
  echo "usage: $0 REPORT.html OUT.png [WIDTH [HEIGHT]]" >&2
  echo "       $0 --check [--passing] REPORT.html [WIDTH [HEIGHT]]" >&2
  exit 2
fi
report=$1
shift
if [ $check = 0 ]; then out=$1; shift; fi
width=${1:-1200}
height=${2:-2000}
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
chrome() {
  "$browser" --headless --no-sandbox --disable-gpu --disable-quic --no-first-run \
    --disable-background-networking --disable-component-update --disable-sync \
    --disable-extensions --user-data-dir="$profile/user" \
    --window-size="$width,$height" "$@" 2>"$profile/chromium.log"
}
if [ $check = 0 ]; then
  abs_report=$(realpath "$report")
  mkdir -p "$(dirname "$out")"
  abs_out=$(realpath "$out")
  rm -f "$abs_out"
  chrome --screenshot="$abs_out" "file://$abs_report" >/dev/null \
    || { cat "$profile/chromium.log" >&2; exit 1; }
  [ -s "$abs_out" ] || { echo "error: no screenshot written" >&2; cat "$profile/chromium.log" >&2; exit 1; }
  echo "$abs_out"
  exit 0
fi
# --check: a copy of the report with a measuring script appended (the report itself has no
# scripts), rendered, and the DOM it leaves read back.
probe='<script>(function(){
var W=window.innerWidth,out=[],clipped=0,scrolling=0;
function scroller(el){for(var p=el.parentElement;p;p=p.parentElement){var cs=getComputedStyle(p);
 if((cs.overflowX=="auto"||cs.overflowX=="scroll")&&p.scrollWidth>p.clientWidth)return p;}return null;}
document.querySelectorAll("table,svg.chart").forEach(function(el){var r=el.getBoundingClientRect();
 if(r.right>W+0.5){var s=scroller(el);if(s&&s.getBoundingClientRect().right<=W+0.5)scrolling++;else clipped++;}});
var sw=document.documentElement.scrollWidth;
out.push("page_overflow="+(sw>W?sw-W:0));
out.push("clipped="+clipped);out.push("scrolling="+scrolling);
var heads=function(t){return Array.prototype.map.call(t.querySelectorAll("th"),function(h){return h.textContent.trim();});};
var lt=Array.prototype.filter.call(document.querySelectorAll("table"),function(t){return heads(t).indexOf("growth")>=0;});
out.push("layer_tables="+lt.length);
out.push("layer_tables_without_cause="+lt.filter(function(t){return heads(t).indexOf("cause")<0;}).length);
var v=document.getElementById("verdict");out.push("verdict="+(v?v.className:"none"));
out.push("red_failed="+Array.prototype.filter.call(document.querySelectorAll(".badge.fail,.verdict.fail .big,td.fail"),function(e){return /FAILED/.test(e.textContent);}).length);
var pre=document.createElement("pre");pre.id="layout-check";pre.textContent="\n"+out.join("\n")+"\n";document.body.appendChild(pre);
})();</script>'
copy="$profile/report.html"
sed "s#</body>#$(printf '%s' "$probe" | tr '\n' ' ' | sed 's/[#&\\]/\\&/g')</body>#" "$report" >"$copy"
dom=$(chrome --dump-dom --virtual-time-budget=3000 "file://$copy") \
  || { cat "$profile/chromium.log" >&2; exit 1; }
facts=$(printf '%s\n' "$dom" | sed -n '/<pre id="layout-check">/,/<\/pre>/p' | grep -E '^[a-z_]+=' || true)
[ -n "$facts" ] || { echo "error: the layout probe did not run" >&2; cat "$profile/chromium.log" >&2; exit 1; }
printf '%s\n' "$facts"
get() { printf '%s\n' "$facts" | sed -n "s/^$1=//p"; }
fail=0
[ "$(get page_overflow)" = 0 ] || { echo "FAILED: the page is wider than the window" >&2; fail=1; }
[ "$(get clipped)" = 0 ] || { echo "FAILED: a table or chart is cut off at the window's edge" >&2; fail=1; }
[ "$(get layer_tables_without_cause)" = 0 ] || { echo "FAILED: a layer table has no cause column" >&2; fail=1; }
if [ $passing = 1 ]; then
  [ "$(get verdict)" = "verdict pass" ] || { echo "FAILED: the verdict is not a pass" >&2; fail=1; }
  [ "$(get red_failed)" = 0 ] || { echo "FAILED: a passing report shows a red FAILED" >&2; fail=1; }
fi
exit $fail
