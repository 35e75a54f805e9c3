# shellcheck shell=bash
# Functions shared by the sbatch scripts in slurm/ (sourced, not run). See SLURM.md.
#
# Every component is one `srun` step started in the background with job control on, so it
# leads its own process group. `atropos_cleanup` (trapped on EXIT) sends TERM to every step
# (scancel --signal), waits ATROPOS_STOP_GRACE seconds, then kills the srun process groups.

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
    srun --nodes=1 --ntasks=1 --nodelist="$node" --overlap --kill-on-bad-exit=1 \
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

# atropos_wait_healthy NAME URL [TIMEOUT_S] [TOKEN]: poll URL until it answers 2xx (with a
# bearer TOKEN when given). Fails at once when the component's process has already exited.
atropos_wait_healthy() {
    local name=$1 url=$2 timeout=${3:-${HEALTH_TIMEOUT:-900}} token=${4:-}
    local deadline=$((SECONDS + timeout)) pid="" i
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
