#!/usr/bin/env bash
# What the test suite needs that pip cannot install, installed once; the
# README's test command runs this before tox.
#
# * Debian packages: chromium (the console browser test), prometheus (promtool:
#   the alert rules' tests), pgbouncer (the transaction-pooling test), nginx
#   (the peer benchmark's receiver).  Only the missing ones are installed,
#   after one `apt-get update`, with sudo unless run as root.  Without apt-get
#   (or without root and sudo) it names what is missing and carries on: the
#   tests that need them fail saying so, every other test runs.
# * The local Postgres cluster, when DISPATCHER_TEST_DSN names 127.0.0.1:5432
#   (as .ci/run does) and Debian's pg_ctlcluster is there: started if down.
#   Without DISPATCHER_TEST_DSN the suite starts its own embedded server.
set -euo pipefail

# "command or absolute path" -> Debian package providing it.
declare -A NEEDS=(
    [/usr/bin/chromium]=chromium
    [promtool]=prometheus
    [pgbouncer]=pgbouncer
    [nginx]=nginx
)

present() {
    # Daemons live in /usr/sbin, which a non-root PATH may lack.
    [ -x "$1" ] || command -v "$1" >/dev/null || [ -x "/usr/sbin/$1" ]
}

as_root() {
    if [ "$(id -u)" -eq 0 ]; then
        "$@"
    else
        sudo "$@"
    fi
}

install_packages() {
    local missing=() tool
    for tool in "${!NEEDS[@]}"; do
        present "$tool" || missing+=("${NEEDS[$tool]}")
    done
    [ ${#missing[@]} -eq 0 ] && return 0
    if ! command -v apt-get >/dev/null || { [ "$(id -u)" -ne 0 ] && ! command -v sudo >/dev/null; }; then
        echo "tests/setup.sh: cannot install ${missing[*]} here (needs apt-get, and root or sudo);" \
             "the tests that use them will fail saying so" >&2
        return 0
    fi
    echo "tests/setup.sh: installing Debian's ${missing[*]}"
    as_root apt-get update -qq
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
}

start_local_postgres() {
    case "${DISPATCHER_TEST_DSN:-}" in
        *127.0.0.1:5432*) ;;
        *) return 0 ;;
    esac
    command -v pg_ctlcluster >/dev/null || return 0
    pg_isready -h 127.0.0.1 -p 5432 -q && return 0
    echo "tests/setup.sh: starting the local PostgreSQL cluster"
    as_root pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | sort -V | tail -n 1)" main start
}

install_packages
start_local_postgres
