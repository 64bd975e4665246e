#!/usr/bin/env bash
# Build the fencekeeper PostgreSQL extension (host/databases/postgres) and install it into the
# server that pg_config names (default: Debian's PostgreSQL 15):
#   scripts/install-postgres-extension.sh [--no-build]
# It copies the shared object as `fencekeeper.so` into `pg_config --pkglibdir` and the
# control file and SQL scripts into `pg_config --sharedir`/extension (as root, or with
# sudo): the install script of the first version, 0.1.0, and one upgrade script per
# version since, which the server chains to install the current one. Then, in a
# database: CREATE EXTENSION fencekeeper;
# The build needs the server headers and libclang (scripts/install-deps.sh installs
# postgresql-server-dev-15 and libclang-dev).
set -euo pipefail
cd "$(dirname "$0")/.."
pg_config=${PG_CONFIG:-/usr/lib/postgresql/15/bin/pg_config}
if [ "${1:-}" != --no-build ]; then
    PGRX_PG_CONFIG_PATH=$pg_config cargo build --release --locked -p fencekeeper-postgres
fi
SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi
libdir=$("$pg_config" --pkglibdir)
extdir="$("$pg_config" --sharedir)/extension"
# A script left from another build would shadow the update path: replace them all.
$SUDO rm -f "$extdir"/fencekeeper--*.sql
$SUDO install -m 755 target/release/libfencekeeper_postgres.so "$libdir/fencekeeper.so"
$SUDO install -m 644 host/databases/postgres/fencekeeper.control host/databases/postgres/sql/fencekeeper--*.sql "$extdir/"
echo "install-postgres-extension: installed $libdir/fencekeeper.so and $extdir/fencekeeper.control" >&2
