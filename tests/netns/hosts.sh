#!/usr/bin/env bash
# hosts.sh — K simulated "hosts" on one machine: one network namespace per host, joined by a bridge that lives in a
# namespace of its own. Addresses exist only inside the namespaces created here; nothing is added to the root
# namespace. Everything is removed again on exit, also on failure or Ctrl-C.
#
# As a command:
#   tests/netns/hosts.sh [--rate RATE] [--mtu BYTES] [--rails R] K M -- COMMAND [ARGS...]
# creates K hosts with M slots each, writes a zcclrun hostfile (docs/tools.md, "Several hosts") and runs COMMAND
# in the root namespace with these variables set:
#   HOSTFILE          the hostfile ("netns:NAME slots=M" per host, in host order)
#   HOSTS_K           K
#   HOSTS_NS          the namespace names of the hosts, space-separated (host i is word i+1)
#   HOSTS_ADDR        their IPv4 addresses, space-separated, same order
#   HOSTS_BRIDGE_NS   the namespace holding the bridge
#   HOSTS_SUBNET      the hosts' subnet (CIDR) of rail 0
#   HOSTS_RAILS       R (1 without --rails)
#   HOSTS_RAIL_SUBNETS  every rail's subnet, space-separated (rail j: 10.200.j.0/24)
#   HOSTS_RAIL_ADDR_j   for each rail j: the hosts' addresses on it, space-separated, host order
# and exits with COMMAND's status. RATE (tc's units: 1gbit, 500mbit, ...) caps every host's link in both
# directions with a tbf qdisc: on the host's side of its veth (what it sends) and on the bridge's side (what it
# receives), so each host has a full-duplex link of RATE. With --rails R (1..8) there are R bridges br0..br(R-1),
# one per rail, and host i has one veth per rail: ethj with address 10.200.j.(i+1)/24 on bridge brj (its port in the
# bridge namespace is p<i> for rail 0, as without --rails, and p<i>r<j> for rail j > 0); each rail is its own
# subnet, and RATE caps every rail's link separately (R rails of RATE each).
#
# As a library (`source tests/netns/hosts.sh`): hosts_up K [RATE] [R] creates the hosts and sets the arrays HOST_NS,
# HOST_ADDR (rail 0) and the variables above; hosts_rail_port I J names host I's rail-J port in the bridge
# namespace; hosts_hostfile M FILE writes a hostfile; hosts_down removes everything (it is
# registered as the EXIT/INT/TERM trap by hosts_up unless HOSTS_NO_TRAP=1, in which case the caller's own trap must
# call it). Host i's interface is eth0 with address 10.200.0.(i+1)/24; the same subnet can be used by any number of
# runs at once because every run has its own bridge namespace. Namespace names are zcPID-RANDOM-hI and
# zcPID-RANDOM-br, unique per run.
#
# Needs root and iproute2 (ip netns, bridge and veth links; tc with tbf for --rate). Without them hosts_up prints
# "SKIP: ..." and returns 77 (the command form exits 77), the code ctest reads as "skipped".

hosts__tag=
HOST_NS=()
HOST_ADDR=()
HOSTS_BRIDGE_NS=
HOSTS_SUBNET=10.200.0.0/24
HOSTS_RAILS=1

# The bridge namespace's name for host i's port on rail j.
hosts_rail_port() { if [ "$2" -eq 0 ]; then echo "p$1"; else echo "p$1r$2"; fi; }

# hosts_scratch VAR: a scratch folder in $VAR (mktemp -d) and the EXIT/INT/TERM traps that remove it and the hosts,
# for a script that keeps files beside its hosts (sets HOSTS_NO_TRAP=1, so call it before hosts_up).
hosts_scratch() {
    local d
    d=$(mktemp -d "${TMPDIR:-/tmp}/zccl-hosts.XXXXXX") || return 1
    printf -v "$1" %s "$d"
    hosts__scratch=$d
    HOSTS_NO_TRAP=1
    trap 'hosts_down; rm -rf "$hosts__scratch"' EXIT
    trap 'hosts_down; rm -rf "$hosts__scratch"; exit 130' INT
    trap 'hosts_down; rm -rf "$hosts__scratch"; exit 143' TERM
}

hosts_down() {
    local ns pid
    for ns in "${HOST_NS[@]}" ${HOSTS_BRIDGE_NS:+"$HOSTS_BRIDGE_NS"}; do
        [ -n "$ns" ] || continue
        # Processes still inside keep the namespace's network alive after `ip netns del`: stop ours first.
        for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -9 "$pid" 2>/dev/null; done
        ip netns del "$ns" 2>/dev/null
    done
    HOST_NS=()
    HOST_ADDR=()
    HOSTS_BRIDGE_NS=
}

# RATE in tc units -> bits per second (for the tbf burst size), or empty if not understood.
hosts__bps() {
    awk -v r="$1" 'BEGIN { if (match(r, /^[0-9.]+/) == 0) exit; v = substr(r, 1, RLENGTH); u = tolower(substr(r, RLENGTH + 1))
        m["bit"] = 1; m["kbit"] = 1e3; m["mbit"] = 1e6; m["gbit"] = 1e9; m["tbit"] = 1e12; m["bps"] = 8
        m["kbps"] = 8e3; m["mbps"] = 8e6; m["gbps"] = 8e9; m[""] = 8
        if (u in m) printf "%.0f\n", v * m[u] }'
}

# tc qdisc tbf on dev in namespace ns: RATE, with a burst of 4 ms at that rate (at least 128 KiB, so that one
# 64 KiB GSO packet always fits) and a queue of 20 ms.
hosts__cap() {
    local ns=$1 dev=$2 rate=$3 bps burst
    bps=$(hosts__bps "$rate")
    [ -n "$bps" ] || { echo "hosts.sh: cannot read rate '$rate' (use tc units: 1gbit, 500mbit, ...)" >&2; return 1; }
    burst=$(awk -v b="$bps" 'BEGIN { x = b / 8 * 0.004; if (x < 131072) x = 131072; printf "%.0f", x }')
    ip netns exec "$ns" tc qdisc replace dev "$dev" root tbf rate "$rate" burst "$burst" latency 20ms
}

hosts_up() {
    local k=$1 rate=${2:-} rails=${3:-1} mtu=${HOSTS_MTU:-} i j ns port dev
    [[ $k =~ ^[0-9]+$ ]] && [ "$k" -ge 1 ] && [ "$k" -le 250 ] || { echo "hosts.sh: K must be 1..250 (got '$k')" >&2; return 2; }
    [[ $rails =~ ^[0-9]+$ ]] && [ "$rails" -ge 1 ] && [ "$rails" -le 8 ] ||
        { echo "hosts.sh: --rails R must be 1..8 (got '$rails')" >&2; return 2; }
    if [ -n "$rate" ] && [ -z "$(hosts__bps "$rate")" ]; then
        echo "hosts.sh: cannot read rate '$rate' (use tc units: 1gbit, 500mbit, ...)" >&2; return 2
    fi
    hosts__tag=zc$$-$RANDOM
    if [ "$(id -u)" -ne 0 ] || ! command -v ip >/dev/null; then
        echo "SKIP: needs root and iproute2 ('ip netns') to create network namespaces"; return 77
    fi
    if [ "${HOSTS_NO_TRAP:-0}" != 1 ]; then
        trap hosts_down EXIT
        trap 'hosts_down; exit 130' INT
        trap 'hosts_down; exit 143' TERM
    fi
    HOSTS_BRIDGE_NS=$hosts__tag-br
    if ! ip netns add "$HOSTS_BRIDGE_NS" 2>/dev/null; then
        HOSTS_BRIDGE_NS=
        echo "SKIP: cannot create a network namespace ('ip netns add' failed: needs root and a kernel with network namespaces)"
        return 77
    fi
    for ((j = 0; j < rails; j++)); do
        ip -n "$HOSTS_BRIDGE_NS" link add br$j type bridge || return 1
        ip -n "$HOSTS_BRIDGE_NS" link set br$j up || return 1
    done
    for ((i = 0; i < k; i++)); do
        ns=$hosts__tag-h$i
        ip netns add "$ns" || return 1
        HOST_NS+=("$ns")
        HOST_ADDR+=("10.200.0.$((i + 1))")
        ip -n "$ns" link set lo up || return 1
        for ((j = 0; j < rails; j++)); do
            port=$(hosts_rail_port "$i" "$j") dev=eth$j
            ip link add "$dev" netns "$ns" ${mtu:+mtu "$mtu"} type veth peer name "$port" netns "$HOSTS_BRIDGE_NS" \
                ${mtu:+mtu "$mtu"} || return 1
            ip -n "$HOSTS_BRIDGE_NS" link set "$port" master br$j || return 1
            ip -n "$HOSTS_BRIDGE_NS" link set "$port" up || return 1
            ip -n "$ns" addr add "10.200.$j.$((i + 1))/24" dev "$dev" || return 1
            ip -n "$ns" link set "$dev" up || return 1
            if [ -n "$rate" ]; then
                hosts__cap "$ns" "$dev" "$rate" || return 1
                hosts__cap "$HOSTS_BRIDGE_NS" "$port" "$rate" || return 1
            fi
        done
    done
    # Wait until every host reaches host 0 on every rail (the bridge forwards once its ports leave the listening
    # state; with STP off, which is the default, that is at once, but the veths' carrier may take a moment).
    for ((j = 0; j < rails; j++)); do
        for ((i = 1; i < k; i++)); do
            local ok=0 t
            for t in $(seq 50); do
                # A TCP connect to a closed port: "refused" (or a connection) means the host answered (no ping needed).
                local probe
                if probe=$(ip netns exec "${HOST_NS[$i]}" timeout 2 bash -c "exec 3<>/dev/tcp/10.200.$j.1/9" 2>&1) ||
                    [[ $probe == *[Rr]efused* ]]; then
                    ok=1; break
                fi
                sleep 0.1
            done
            [ $ok = 1 ] || { echo "hosts.sh: host $i (${HOST_NS[$i]}) cannot reach host 0 at 10.200.$j.1 (rail $j)" >&2; return 1; }
        done
    done
    HOSTS_K=$k
    HOSTS_NS="${HOST_NS[*]}"
    HOSTS_ADDR="${HOST_ADDR[*]}"
    HOSTS_RAILS=$rails
    HOSTS_RAIL_SUBNETS=
    for ((j = 0; j < rails; j++)); do
        HOSTS_RAIL_SUBNETS+="${HOSTS_RAIL_SUBNETS:+ }10.200.$j.0/24"
        local list=
        for ((i = 0; i < k; i++)); do list+="${list:+ }10.200.$j.$((i + 1))"; done
        printf -v "HOSTS_RAIL_ADDR_$j" '%s' "$list"
        export "HOSTS_RAIL_ADDR_$j"
    done
    export HOSTS_K HOSTS_NS HOSTS_ADDR HOSTS_BRIDGE_NS HOSTS_SUBNET HOSTS_RAILS HOSTS_RAIL_SUBNETS
    return 0
}

# hosts_hostfile M FILE: one "netns:NAME slots=M" line per host.
hosts_hostfile() {
    local m=$1 f=$2 ns
    : >"$f" || return 1
    for ns in "${HOST_NS[@]}"; do echo "netns:$ns slots=$m" >>"$f"; done
}

hosts__main() {
    local rate= rails=1 k m rc
    while [ $# -gt 0 ]; do
        case $1 in
            --rate) rate=$2; shift 2 ;;
            --rails) rails=$2; shift 2 ;;
            --mtu) HOSTS_MTU=$2; shift 2 ;;
            -h|--help) sed -n '2,26p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; return 0 ;;
            *) break ;;
        esac
    done
    k=${1:-}; m=${2:-}
    [ $# -ge 4 ] && [ "$3" = "--" ] || { echo "usage: hosts.sh [--rate RATE] [--mtu BYTES] [--rails R] K M -- COMMAND [ARGS...]" >&2; return 2; }
    [[ $m =~ ^[0-9]+$ ]] && [ "$m" -ge 1 ] || { echo "hosts.sh: M must be a positive integer (got '$m')" >&2; return 2; }
    shift 3
    hosts_scratch hosts__dir || return 1
    hosts_up "$k" "$rate" "$rails"; rc=$?
    [ $rc -eq 0 ] || return $rc
    HOSTFILE=$hosts__dir/hostfile
    hosts_hostfile "$m" "$HOSTFILE" || return 1
    export HOSTFILE
    "$@"
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
    set -u
    hosts__main "$@"
    exit $?
fi
