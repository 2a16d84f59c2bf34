#!/usr/bin/env bash
# CI: a real PostgreSQL server for tests/test_postgres.py, from Debian's `postgresql` package.
# Idempotent: installs only what is missing, starts the cluster unless it is already up, creates the
# role and database only if missing. Works as root in a container where systemd is not running.
# Progress goes to stderr; the last line on stdout is the URL to test against:
#   REPLAYBENCH_TEST_POSTGRES_URL=$(bash .ci/postgres.sh | tail -1)
set -euo pipefail

ROLE=replaybench
PASSWORD=replaybench
DATABASE=replaybench_test
HOST=127.0.0.1
PYTHON=${PYTHON:-python3}

log() { echo "postgres.sh: $*" >&2; }

as_postgres() {
  # psql etc. as the cluster owner, over the local socket (peer authentication).
  if [ "$(id -u)" -eq 0 ]; then
    (cd / && runuser -u postgres -- "$@")
  else
    (cd / && sudo -n -u postgres -- "$@")
  fi
}

# 1. The server package.
if ! command -v pg_ctlcluster >/dev/null; then
  log "installing postgresql with apt"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >/dev/null
  apt-get install -y -qq --no-install-recommends postgresql >/dev/null
fi

# 2. A cluster: Debian's package creates "<version> main"; create it if the package did not.
cluster_line() { pg_lsclusters --no-header 2>/dev/null | awk '$2 == "main"' | sort -V | tail -1; }
if [ -z "$(cluster_line)" ]; then
  version=$(ls /usr/lib/postgresql | sort -V | tail -1)
  log "creating cluster $version main"
  pg_createcluster --locale C.UTF-8 "$version" main >/dev/null
fi
read -r VERSION _ PORT STATUS _ <<<"$(cluster_line)"

# 3. Start it (pg_ctlcluster runs pg_ctl directly when systemd is not running).
if [ "$STATUS" != "online" ]; then
  log "starting cluster $VERSION main on port $PORT"
  pg_ctlcluster "$VERSION" main start
fi
for _ in $(seq 120); do
  pg_isready -q -h "$HOST" -p "$PORT" && break
  sleep 0.5
done
if ! pg_isready -q -h "$HOST" -p "$PORT"; then
  log "the server does not answer on $HOST:$PORT; its log:"
  tail -n 30 "/var/log/postgresql/postgresql-$VERSION-main.log" >&2 || true
  exit 1
fi

psql_admin() { as_postgres psql -X -q -v ON_ERROR_STOP=1 -p "$PORT" -d postgres "$@"; }

# Keep the Debian default: loopback only.
listen=$(psql_admin -At -c "SHOW listen_addresses")
case "$listen" in
  localhost | 127.0.0.1 | "127.0.0.1,::1" | "localhost,127.0.0.1") ;;
  *) log "listen_addresses is '$listen': expected the Debian default, localhost only"; exit 1 ;;
esac

# 4. Role and database, created if missing; the role's password and CREATEDB are (re)asserted.
psql_admin <<SQL
SELECT 'CREATE ROLE $ROLE LOGIN' WHERE NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '$ROLE')
\gexec
ALTER ROLE $ROLE WITH LOGIN CREATEDB PASSWORD '$PASSWORD';
SELECT 'CREATE DATABASE $DATABASE OWNER $ROLE' WHERE NOT EXISTS (SELECT FROM pg_database WHERE datname = '$DATABASE')
\gexec
SQL

# 5. The driver SQLAlchemy's postgresql+psycopg dialect uses.
if ! "$PYTHON" -c "import psycopg" 2>/dev/null; then
  log "installing psycopg[binary]"
  "$PYTHON" -m pip install -q 'psycopg[binary]' >&2
fi

# 6. Prove the URL works: password authentication over TCP, as the test role.
PGPASSWORD=$PASSWORD psql -X -q -v ON_ERROR_STOP=1 -h "$HOST" -p "$PORT" -U "$ROLE" -d "$DATABASE" -At \
  -c "SELECT 1" >/dev/null
"$PYTHON" - "$HOST" "$PORT" <<'PY'
import sys

import psycopg

with psycopg.connect(host=sys.argv[1], port=int(sys.argv[2]), user="replaybench", password="replaybench",
                     dbname="replaybench_test", connect_timeout=10) as con:
    version = con.execute("SHOW server_version").fetchone()[0]
print(f"postgres.sh: PostgreSQL {version} ready (psycopg {psycopg.__version__})", file=sys.stderr)
PY

echo "postgresql+psycopg://$ROLE:$PASSWORD@$HOST:$PORT/$DATABASE"
