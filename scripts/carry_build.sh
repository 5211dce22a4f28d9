#!/usr/bin/env bash
# Copies the programs of a build (the library, tools, test and benchmark binaries, examples) into DEST in the build's
# own layout, so that a machine without the build tree can run them (rpaths are $ORIGIN-relative): e.g. a GPU machine
# that receives the working tree plus DEST. The test binaries name the source tree they were built from; run them from
# a checkout at the same path, or link that path to the checkout there.
#   usage: scripts/carry_build.sh <build dir> <dest>
set -euo pipefail
if [[ ${1:-} == -h || ${1:-} == --help || $# -ne 2 ]]; then
    sed -n '2,6p' "$0" | sed 's/^# \{0,1\}//'
    [[ $# -eq 2 ]] && exit 0 || exit 2
fi
b=$1 d=$2
rm -rf "$d"
mkdir -p "$d"/bin "$d"/tests "$d"/bench "$d"/examples
cp -a "$b"/libloom.so* "$d"/
cp -a "$b"/bin/. "$d"/bin/
for f in "$b"/tests/loom_gpu_tests "$b"/tests/loom_dist_tests "$b"/tests/loom_test_child "$b"/bench/* "$b"/examples/*; do
    [[ -f $f && -x $f ]] || continue
    rel=${f#"$b"/}
    cp -a "$f" "$d/$rel"
done
du -sh "$d"
