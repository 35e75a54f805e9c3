# shellcheck shell=bash
# Functions shared by the sbatch scripts in slurm/ (sourced, not run). See SLURM.md.
#
# Every component is one `srun` step started in the background with job control on, so it
# leads its own process group. `atropos_cleanup` (trapped on EXIT) sends TERM to every step
# (scancel --signal), waits ATROPOS_STOP_GRACE seconds, then kills the srun process groups.
#
# A wait trusts only the step it started: `atropos_port_free` stops the job before a launch
# when something already answers on the port, and `atropos_wait_healthy` accepts an answer only
# when every socket listening on the port is held by a process of that step (each step carries
# ATROPOS_STEP=<job id>/<name> in its environment, which its children inherit).

ATROPOS_PIDS=()
ATROPOS_NAMES=()
ATROPOS_STOP_GRACE=${ATROPOS_STOP_GRACE:-30}

atropos_log() {
    printf '%s [atropos] %s\n' "$(date -u +%H:%M:%S)" "$*" >&2
}

atropos_die() {
    atropos_log "error: $*"
    exit 1
}

# atropos_launch NAME NODE [SRUN_OPTION...] -- COMMAND...
# Starts COMMAND as one srun step on NODE, output in $LOG_DIR/NAME.log.
atropos_launch() {
    local name=$1 node=$2
    shift 2
    local srun_opts=()
    while [[ $# -gt 0 && $1 != "--" ]]; do
        srun_opts+=("$1")
        shift
    done
    [[ ${1:-} == "--" ]] || atropos_die "atropos_launch $name: missing -- before the command"
    shift
    atropos_log "start $name on $node: $*"
    printf '%s\t%s\t%s\n' "$name" "$node" "$*" >>"$LOG_DIR/commands.tsv"
    set -m
    local extra
    read -r -a extra <<<"${SRUN_ARGS:-}"
    ATROPOS_STEP="$SLURM_JOB_ID/$name" srun --nodes=1 --ntasks=1 --nodelist="$node" --overlap --kill-on-bad-exit=1 \
        --job-name="$name" --output="$LOG_DIR/$name.log" --error="$LOG_DIR/$name.log" \
        "${extra[@]}" "${srun_opts[@]}" "$@" &
    local pid=$!
    set +m
    ATROPOS_PIDS+=("$pid")
    ATROPOS_NAMES+=("$name")
}

# atropos_name_of PID: the component name of a pid started by atropos_launch.
atropos_name_of() {
    local i
    for i in "${!ATROPOS_PIDS[@]}"; do
        if [[ ${ATROPOS_PIDS[$i]} == "$1" ]]; then
            printf '%s' "${ATROPOS_NAMES[$i]}"
            return 0
        fi
    done
    printf 'unknown'
}

# atropos_probe URL [TOKEN]: one GET that answers 2xx. A bearer TOKEN goes in a header that
# curl reads from a pipe, so it never shows on a command line (ps, commands.tsv).
atropos_probe() {
    local url=$1 token=${2:-}
    if [[ -n $token ]]; then
        curl --silent --fail --max-time 5 --output /dev/null \
            --header @<(printf 'Authorization: Bearer %s\n' "$token") "$url"
    else
        curl --silent --fail --max-time 5 --output /dev/null "$url"
    fi
}

# atropos_host_port URL: "HOST PORT" of http://HOST:PORT/...
atropos_host_port() {
    local rest=${1#*://}
    rest=${rest%%/*}
    printf '%s %s\n' "${rest%:*}" "${rest##*:}"
}

# atropos_port_free NAME URL: stop the job, naming HOST:PORT, when something already accepts
# connections where NAME is to listen (a connect test, from here: its node may be another one).
atropos_port_free() {
    local name=$1 host port
    read -r host port <<<"$(atropos_host_port "$2")"
    # shellcheck disable=SC2016  # $1 and $2 are the inner bash's arguments
    if timeout 5 bash -c 'exec 3<>"/dev/tcp/$1/$2"' _ "$host" "$port" 2>/dev/null; then
        atropos_die "port $host:$port is already in use; not starting $name"
    fi
}

# atropos_port_holders PORT MARKER, on the server's node: succeeds when every socket listening
# on PORT is held by a process whose environment has ATROPOS_STEP=MARKER; else prints who holds
# one and fails. It reads /proc only, so it needs no `ss`.
atropos_port_holders() {
    local port=$1 marker=$2 inode fd pid holders ours inodes=()
    mapfile -t inodes < <(awk -v p=":$(printf '%04X' "$port")" \
        '$4 == "0A" && substr($2, length($2) - 4) == p { print $10 }' /proc/net/tcp{,6} 2>/dev/null)
    ((${#inodes[@]} > 0)) || { printf 'no process on this node'; return 1; }
    for inode in "${inodes[@]}"; do
        ours=0 holders=""
        while read -r fd; do
            pid=${fd#/proc/}
            pid=${pid%%/*}
            holders+="${holders:+, }pid $pid ($(cat "/proc/$pid/comm" 2>/dev/null))"
            if tr '\0' '\n' <"/proc/$pid/environ" 2>/dev/null | grep -qxF "ATROPOS_STEP=$marker"; then
                ours=1
            fi
        done < <(find /proc/[0-9]*/fd -maxdepth 1 -lname "socket:\[$inode\]" 2>/dev/null)
        if ((!ours)); then
            printf '%s' "${holders:-a process of another user}"
            return 1
        fi
    done
}

# atropos_on_node NODE FUNCTION [ARG...]: run one of these functions on NODE, as a step of its own.
atropos_on_node() {
    local node=$1 extra
    shift
    read -r -a extra <<<"${SRUN_ARGS:-}"
    srun --nodes=1 --ntasks=1 --nodelist="$node" --overlap --job-name=atropos-port-check \
        "${extra[@]}" bash -c "$(declare -f "$1"); \"\$@\"" _ "$@"
}

# atropos_wait_healthy NAME URL [TIMEOUT_S] [TOKEN]: poll URL until it answers 2xx (with a
# bearer TOKEN when given), then make sure NAME's step holds the port (not another server that
# was there first). Fails at once when the component's process has already exited.
atropos_wait_healthy() {
    local name=$1 url=$2 timeout=${3:-${HEALTH_TIMEOUT:-900}} token=${4:-}
    local deadline=$((SECONDS + timeout)) pid="" i host port holder
    for i in "${!ATROPOS_NAMES[@]}"; do
        [[ ${ATROPOS_NAMES[$i]} == "$name" ]] && pid=${ATROPOS_PIDS[$i]}
    done
    atropos_log "waiting for $name at $url (up to ${timeout}s)"
    until atropos_probe "$url" "$token"; do
        if [[ -n $pid ]] && ! kill -0 "$pid" 2>/dev/null; then
            atropos_die "$name exited before it was healthy; see $LOG_DIR/$name.log"
        fi
        ((SECONDS < deadline)) || atropos_die "$name not healthy after ${timeout}s: $url"
        sleep 2
    done
    read -r host port <<<"$(atropos_host_port "$url")"
    if ! holder=$(atropos_on_node "$host" atropos_port_holders "$port" "$SLURM_JOB_ID/$name"); then
        atropos_die "$name: $url answered, but port $host:$port is held by $holder, not by $name; stop that one or choose another port"
    fi
    atropos_log "$name is healthy"
}

atropos_cleanup() {
    local status=$? pid deadline
    trap - EXIT INT TERM
    atropos_log "stopping ${#ATROPOS_PIDS[@]} component(s)"
    # TERM to every step's tasks (srun itself answers TERM with an immediate SIGKILL of its
    # tasks, so the polite signal goes through scancel), then wait for them to exit.
    scancel --signal=TERM "$SLURM_JOB_ID" 2>/dev/null || true
    deadline=$((SECONDS + ATROPOS_STOP_GRACE))
    for pid in "${ATROPOS_PIDS[@]}"; do
        while kill -0 "$pid" 2>/dev/null && ((SECONDS < deadline)); do
            sleep 1
        done
    done
    for pid in "${ATROPOS_PIDS[@]}"; do  # what is left: the whole process group of its srun
        if kill -0 "$pid" 2>/dev/null; then
            atropos_log "$(atropos_name_of "$pid") still running after ${ATROPOS_STOP_GRACE}s; killing it"
            kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true
        fi
    done
    sleep 2
    for pid in "${ATROPOS_PIDS[@]}"; do
        kill -KILL -- "-$pid" 2>/dev/null || true
    done
    wait 2>/dev/null || true
    atropos_log "done (exit status $status); logs in $LOG_DIR"
    exit "$status"
}

# atropos_supervise MAIN_NAME: wait until MAIN_NAME exits (its status becomes the job's).
# Another component exiting with a non-zero status first fails the job; one that finishes
# cleanly (an environment that reached total_steps) is let go.
atropos_supervise() {
    local main=$1 pid status name waiting=("${ATROPOS_PIDS[@]}") rest other
    while ((${#waiting[@]} > 0)); do
        status=0
        wait -n -p pid "${waiting[@]}" || status=$?
        name=$(atropos_name_of "$pid")
        if [[ $name == "$main" ]]; then
            atropos_log "$main exited with status $status"
            return "$status"
        fi
        if ((status != 0)); then
            atropos_log "$name failed (status $status) before $main finished; see $LOG_DIR/$name.log"
            return 1
        fi
        atropos_log "$name finished (status 0)"
        rest=()
        for other in "${waiting[@]}"; do
            [[ $other == "$pid" ]] || rest+=("$other")
        done
        waiting=("${rest[@]}")
    done
    return 1
}
