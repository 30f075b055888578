#!/usr/bin/env bash
# A guarded fleet on this machine, without Docker, for trying aaa_celery end to end:
#   - Redis with AOF (the broker and the result backend),
#   - PostgreSQL (the guard's store),
#   - two worker pools with distinct node names (-n), each serving Prometheus metrics,
#   - Flower,
#   - the Flask example app (examples/flask_app).
# Every server listens on a free loopback port. Ctrl-C or SIGTERM stops everything this
# script started, by PID (started in the background or under nohup, bash ignores Ctrl-C's
# SIGINT: stop it with `kill PID`, SIGTERM). docker-compose.yml at the repository root runs the same fleet.
#
# Needs redis-server, PostgreSQL's initdb/pg_ctl (on PATH, or in the newest
# /usr/lib/postgresql/*/bin as Debian installs them: apt-get install redis-server postgresql), and
#   pip install -e '.[postgres,flask,metrics]' flower
# A server that fails to start stops the script with the end of its log.
#
#   examples/fleet.sh                 # prints the URLs, then runs until Ctrl-C
#   AAA_FLEET_DIR=/tmp/f examples/fleet.sh    # keep logs, data and the env file there
#
# Once it is up, $AAA_FLEET_DIR/env holds the fleet's addresses as shell variables:
#   . /tmp/f/env && cd examples/flask_app && celery -A worker aaa calls
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
APP_DIR="$ROOT/examples/flask_app"
RUN=${AAA_FLEET_DIR:-$(mktemp -d "${TMPDIR:-/tmp}/aaa-fleet.XXXXXX")}
mkdir -p "$RUN"
PYTHON=${PYTHON:-python3}
PIDS=()
PG_DIR="$RUN/pg"
PG_STARTED=""

free_port() {
  "$PYTHON" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

failed() {  # failed WHAT LOG...: say what failed, with the end of each log that exists
  echo "fleet.sh: $1" >&2
  shift
  for log in "$@"; do
    if [ -s "$log" ]; then
      echo "--- the end of $log:" >&2
      tail -n 20 "$log" >&2
    fi
  done
  exit 1
}

wait_port() {  # wait_port PORT NAME LOG: until something listens on 127.0.0.1:PORT
  for _ in $(seq 1 300); do
    if "$PYTHON" -c "import socket,sys; socket.create_connection(('127.0.0.1', $1), 0.2)" 2>/dev/null; then
      return 0
    fi
    sleep 0.1
  done
  failed "$2 did not listen on port $1" "$3"
}

pg_bin() {  # pg_bin NAME: PostgreSQL's NAME on PATH, else in the newest /usr/lib/postgresql/*/bin
  local found
  found=$(command -v "$1" || ls -d /usr/lib/postgresql/*/bin/"$1" 2>/dev/null | sort -V | tail -n 1)
  [ -n "$found" ] || failed "PostgreSQL's $1 is not installed (apt-get install postgresql)"
  echo "$found"
}

as_postgres() {  # PostgreSQL refuses to run as root
  if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}

stop_all() {
  trap - EXIT INT TERM
  echo "fleet.sh: stopping ${#PIDS[@]} processes"
  for ((i = ${#PIDS[@]} - 1; i >= 0; i--)); do
    kill -TERM "${PIDS[$i]}" 2>/dev/null || true
  done
  for pid in "${PIDS[@]}"; do
    for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
  done
  if [ -n "$PG_STARTED" ] && [ -f "$PG_DIR/data/postmaster.pid" ]; then
    pg_pid=$(head -1 "$PG_DIR/data/postmaster.pid")
    kill -INT "$pg_pid" 2>/dev/null || true   # PostgreSQL's fast shutdown, by its PID
    for _ in $(seq 1 100); do kill -0 "$pg_pid" 2>/dev/null || break; sleep 0.1; done
  fi
  if [ -f "$RUN/pg_dir" ]; then rm -rf "$(cat "$RUN/pg_dir")"; fi  # root's temp PostgreSQL directory
  rm -f "$RUN/ready"
  echo "fleet.sh: stopped"
}
trap stop_all EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

start() {  # start NAME COMMAND...: run in the background, log to $RUN/NAME.log, remember the PID
  local name=$1; shift
  "$@" >"$RUN/$name.log" 2>&1 &
  PIDS+=($!)
  echo "$name $!" >>"$RUN/pids"
}
: >"$RUN/pids"

# Redis, with AOF: a restart keeps queued messages and the results.
REDIS_PORT=$(free_port)
mkdir -p "$RUN/redis"
start redis redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --dir "$RUN/redis" \
  --appendonly yes --appendfsync everysec --save ""
wait_port "$REDIS_PORT" redis "$RUN/redis.log"

# PostgreSQL: the guard's store (session leases, durable attempts and results).
INITDB=$(pg_bin initdb)
PG_CTL=$(pg_bin pg_ctl)
PG_PORT=$(free_port)
if [ "$(id -u)" = 0 ]; then
  # as root, PostgreSQL runs as the postgres user, in a directory of its own that it can reach
  PG_DIR=$(mktemp -d "${TMPDIR:-/tmp}/aaa-fleet-pg.XXXXXX")
  chmod 755 "$PG_DIR"
  chown postgres "$PG_DIR"
  echo "$PG_DIR" >"$RUN/pg_dir"
else
  mkdir -p "$PG_DIR"
fi
as_postgres "$INITDB" -D "$PG_DIR/data" -A trust -U postgres >"$RUN/initdb.log" 2>&1 \
  || failed "PostgreSQL's initdb failed" "$RUN/initdb.log"
as_postgres "$PG_CTL" -D "$PG_DIR/data" -l "$PG_DIR/postgres.log" -w \
  -o "-p $PG_PORT -k $PG_DIR -c listen_addresses=127.0.0.1" start >"$RUN/pg_ctl.log" 2>&1 \
  || failed "PostgreSQL did not start" "$RUN/pg_ctl.log" "$PG_DIR/postgres.log"
PG_STARTED=1
echo "postgres $(head -1 "$PG_DIR/data/postmaster.pid")" >>"$RUN/pids"

export AAA_REDIS_URL="redis://127.0.0.1:$REDIS_PORT/0"
export AAA_STORE_URL="postgresql+psycopg://postgres@127.0.0.1:$PG_PORT/postgres"
export PYTHONPATH="$APP_DIR:$ROOT${PYTHONPATH:+:$PYTHONPATH}"
cd "$APP_DIR"

# Two worker pools, each with its own node name and metrics port.
METRICS_A=$(free_port)
METRICS_B=$(free_port)
start pool-a env AAA_METRICS_PORT="$METRICS_A" celery -A worker worker -E -n "pool-a@%h" -Q aaa.default -c 2 --loglevel INFO
start pool-b env AAA_METRICS_PORT="$METRICS_B" celery -A worker worker -E -n "pool-b@%h" -Q aaa.default,celery -c 2 --loglevel INFO
wait_port "$METRICS_A" "pool-a's metrics" "$RUN/pool-a.log"
wait_port "$METRICS_B" "pool-b's metrics" "$RUN/pool-b.log"

FLOWER_PORT=$(free_port)
start flower celery -A worker flower --address=127.0.0.1 --port="$FLOWER_PORT"
wait_port "$FLOWER_PORT" flower "$RUN/flower.log"

FLASK_PORT=$(free_port)
start flask "$PYTHON" -m flask --app app run --host 127.0.0.1 --port "$FLASK_PORT"
wait_port "$FLASK_PORT" "the Flask app" "$RUN/flask.log"

cat >"$RUN/env" <<ENV
export AAA_REDIS_URL=$AAA_REDIS_URL
export AAA_STORE_URL=$AAA_STORE_URL
export AAA_FLEET_FLASK=http://127.0.0.1:$FLASK_PORT
export AAA_FLEET_FLOWER=http://127.0.0.1:$FLOWER_PORT
export AAA_FLEET_METRICS="http://127.0.0.1:$METRICS_A/metrics http://127.0.0.1:$METRICS_B/metrics"
ENV
touch "$RUN/ready"
cat <<INFO
fleet.sh: up (logs, data and env in $RUN)
  Flask app   http://127.0.0.1:$FLASK_PORT/aaa/   (start "refund order A-100", approve it)
  Flower      http://127.0.0.1:$FLOWER_PORT/
  metrics     http://127.0.0.1:$METRICS_A/metrics  http://127.0.0.1:$METRICS_B/metrics
  Redis       $AAA_REDIS_URL   PostgreSQL (store) $AAA_STORE_URL
  CLI         . $RUN/env && cd examples/flask_app && celery -A worker aaa calls
Ctrl-C (or kill $$, SIGTERM) stops it all.
INFO
wait
