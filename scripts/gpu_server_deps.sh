#!/usr/bin/env bash
# Run HERE (the Debian 12 dev machine), not on the GPU machine: fills a folder with what the GPU
# machine (Ubuntu 24.04, no network) lacks to build the server: the HEADERS of PCRE2, ICU and
# cpp-httplib, plus pkg-config files that point CMake at them and at the runtime libraries that
# machine does have (libpcre2-8.so.0, libicuuc.so.74; it has no unversioned .so links, so the .pc
# files link them by file name with -l:NAME). scripts/gpu_serve.sh sets PKG_CONFIG_PATH to
# OUT/pkgconfig. About 5 MiB.
#   scripts/gpu_server_deps.sh [OUT]        (default .deps/gpu-server)
#   env: ICU_MAJOR / ICU_MINOR: the ICU the headers are edited to name (default 74 / 2, Ubuntu noble's
#        libicu74; ICU_MAJOR=72 ICU_MINOR=1 gives headers that link here, to test the mechanics);
#        HTTPLIB_GIT: a clone of yhirose/cpp-httplib (default: the search tool's mirror).
#
# What each piece is and why it is safe:
# - pcre2.h: Debian 12's libpcre2-dev 10.42 header = the version Ubuntu noble ships (10.42).
# - ICU: Debian's ICU 72 headers with unicode/uvernum.h edited to ICU_MAJOR. ICU's C entry points get
#   the version as a suffix (urename.h: u_errorName -> u_errorName_74) and its C++ classes live in
#   namespace icu_74, so the edited headers name the symbols of libicuuc.so.74; a symbol missing there
#   would fail the link, not run. The tokenizer's only ICU calls (server/tokenizer.cpp nfc():
#   Normalizer2::getNFCInstance, Normalizer2::normalize, UnicodeString::fromUTF8 / toUTF8String,
#   u_errorName) are stable API since ICU 49. scripts/gpu_serve.sh checks NFC at run time through
#   /tokenize (precomposed and decomposed text must give the same tokens).
# - httplib.h: upstream v0.11.4 single header (header-only; Debian's 0.11.4 is the same release
#   compiled into libcpp-httplib.so, whose OpenSSL/zlib/brotli dependencies the GPU machine may
#   lack). Without CPPHTTPLIB_OPENSSL_SUPPORT: http only, which is all serve and bench serve use.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-.deps/gpu-server}
icu_major=${ICU_MAJOR:-74}
icu_minor=${ICU_MINOR:-2}
httplib_git=${HTTPLIB_GIT:-/work/.mirror/yhirose+cpp-httplib/repo}
httplib_tag=v0.11.4

[ -f /usr/include/pcre2.h ] || { echo "missing /usr/include/pcre2.h: apt-get install libpcre2-dev" >&2; exit 1; }
[ -f /usr/include/unicode/uvernum.h ] || { echo "missing ICU headers: apt-get install libicu-dev" >&2; exit 1; }
git --git-dir="$httplib_git" rev-parse -q --verify "$httplib_tag^{commit}" >/dev/null 2>&1 ||
  git -C "$httplib_git" rev-parse -q --verify "$httplib_tag^{commit}" >/dev/null 2>&1 ||
  { echo "no cpp-httplib clone with tag $httplib_tag at $httplib_git (set HTTPLIB_GIT)" >&2; exit 1; }

rm -rf "$out"
mkdir -p "$out/include" "$out/pkgconfig"

cp /usr/include/pcre2.h "$out/include/"
pcre2_version=$(awk '/#define PCRE2_MAJOR/{a=$3} /#define PCRE2_MINOR/{b=$3} END{print a"."b}' "$out/include/pcre2.h")

cp -r /usr/include/unicode "$out/include/unicode"
vernum="$out/include/unicode/uvernum.h"
from_major=$(awk '/^#define U_ICU_VERSION_MAJOR_NUM/{print $3}' "$vernum")
from_minor=$(awk '/^#define U_ICU_VERSION_MINOR_NUM/{print $3}' "$vernum")
sed -i -E \
  -e "s/^(#define U_ICU_VERSION_MAJOR_NUM) ${from_major}\$/\1 ${icu_major}/" \
  -e "s/^(#define U_ICU_VERSION_MINOR_NUM) ${from_minor}\$/\1 ${icu_minor}/" \
  -e "s/^(#define U_ICU_VERSION_SUFFIX) _${from_major}\$/\1 _${icu_major}/" \
  -e "s/^(#define U_ICU_VERSION) \"${from_major}\.${from_minor}\"\$/\1 \"${icu_major}.${icu_minor}\"/" \
  -e "s/^(#define U_ICU_VERSION_SHORT) \"${from_major}\"\$/\1 \"${icu_major}\"/" \
  -e "s/^(#define U_ICU_DATA_VERSION) \"${from_major}\.${from_minor}\"\$/\1 \"${icu_major}.${icu_minor}\"/" \
  "$vernum"
# Every version number the header defines must now be the target one.
for macro in U_ICU_VERSION_MAJOR_NUM U_ICU_VERSION_SUFFIX U_ICU_VERSION U_ICU_VERSION_SHORT U_ICU_DATA_VERSION; do
  grep -qE "^#define $macro \"?_?${icu_major}" "$vernum" || { echo "uvernum.h: $macro not edited to $icu_major" >&2; exit 1; }
done

git --git-dir="$httplib_git" show "$httplib_tag:httplib.h" >"$out/include/httplib.h" 2>/dev/null ||
  git -C "$httplib_git" show "$httplib_tag:httplib.h" >"$out/include/httplib.h"
grep -q '#define CPPHTTPLIB_VERSION "0.11.4"' "$out/include/httplib.h" ||
  { echo "httplib.h from $httplib_tag is not 0.11.4" >&2; exit 1; }

# ${pcfiledir}: the .pc files work wherever the folder is carried.
cat >"$out/pkgconfig/libpcre2-8.pc" <<EOF
prefix=\${pcfiledir}/..
includedir=\${prefix}/include
Name: libpcre2-8
Description: PCRE2 8-bit (headers carried; the runtime libpcre2-8.so.0 of the machine)
Version: ${pcre2_version}
Libs: -l:libpcre2-8.so.0
Cflags: -I\${includedir}
EOF
cat >"$out/pkgconfig/icu-uc.pc" <<EOF
prefix=\${pcfiledir}/..
includedir=\${prefix}/include
Name: icu-uc
Description: ICU common (headers edited to ${icu_major}.${icu_minor}; the runtime libicuuc.so.${icu_major} of the machine)
Version: ${icu_major}.${icu_minor}
Libs: -l:libicuuc.so.${icu_major}
Cflags: -I\${includedir}
EOF
cat >"$out/pkgconfig/cpp-httplib.pc" <<EOF
prefix=\${pcfiledir}/..
includedir=\${prefix}/include
Name: cpp-httplib
Description: cpp-httplib ${httplib_tag#v}, header-only, http only
Version: ${httplib_tag#v}
Libs: -pthread
Cflags: -I\${includedir}
EOF
echo "$out: pcre2 $pcre2_version, ICU headers $from_major.$from_minor -> $icu_major.$icu_minor, cpp-httplib ${httplib_tag#v} header-only ($(du -sh "$out" | cut -f1))"
