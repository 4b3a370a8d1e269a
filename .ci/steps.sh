# Sourced by .ci/run: steps, each timed, its output in a log of its own, in the background or not.
#   step NAME CMD...         runs CMD (a command or a shell function) as a step, its output shown as it
#                            comes, and waits for it; first reports any background step that failed
#   step_start NAME CMD...   starts it in the background; its output is shown when step_wait reaps it
#   step_wait NAME           waits for a background step, shows its output; fails when the step failed
#   step_log NAME            the file a step's output goes to
#   on_exit CMD              runs CMD when the script exits (last registered first), before the table
# A step runs in a subshell of its own with errexit on, so a failing command in a shell function fails
# the step. At exit the script stops the steps still running (their process trees, by PID), shows the
# end of their logs, and prints each step's start, wall time and CPU time (user + system of the step
# and every process it waited for) as a table.

CI_LOGS=${SANDBOXD_CI_LOGS:-$(mktemp -d /tmp/sandboxd-ci.XXXXXX)}
mkdir -p "$CI_LOGS"
CI_T0=$(date +%s%N)
declare -A STEP_PID=()  # the steps running in the background, by name
declare -A STEP_RC=()   # the steps reaped, by name: their exit status
STEP_ORDER=()
EXIT_HOOKS=()

ci_secs() { echo $(( ($(date +%s%N) - CI_T0) / 1000000000 )); }
mmss() { printf '%d:%02d' $(($1 / 60)) $(($1 % 60)); }
log() { printf '\n== [%s] %s\n' "$(mmss "$(ci_secs)")" "$*"; }
step_log() { echo "$CI_LOGS/$1.log"; }
on_exit() { EXIT_HOOKS=("$*" "${EXIT_HOOKS[@]}"); }

# cpu_of FILE: the user + system seconds in FILE, the output of `times` (this shell and its waited-for
# children). `times` must run in the shell it measures: in a pipe or $(...) it reports a subshell's zeros.
cpu_of() { tr 'ms\n' '   ' < "$1" | awk '{t = 0; for (i = 1; i <= NF; i += 2) t += $i * 60 + $(i + 1); printf "%d", t}'; }

step_start() {
  local name=$1
  shift
  STEP_ORDER+=("$name")
  log "$name: started ($*)"
  : > "$CI_LOGS/$name.log" # there before step's tail opens it (the subshell's redirection may come later)
  (
    start=$(ci_secs)
    trap 'rc=$?; times > "$CI_LOGS/$name.cpu"; echo "$rc $start $(ci_secs) $(cpu_of "$CI_LOGS/$name.cpu")" > "$CI_LOGS/$name.time"' EXIT
    "$@"
  ) > "$CI_LOGS/$name.log" 2>&1 < /dev/null &
  STEP_PID[$name]=$!
}

# step_done NAME RC: reports a reaped step; returns RC.
step_done() {
  local name=$1 rc=$2 start=0 end=0 cpu=0
  [ ! -f "$CI_LOGS/$name.time" ] || read -r _ start end cpu < "$CI_LOGS/$name.time"
  if [ "$rc" = 0 ]; then
    log "$name: ok, $((end - start))s (CPU ${cpu}s)"
  else
    log "$name: FAILED (exit $rc) after $((end - start))s (CPU ${cpu}s); log: $(step_log "$name")"
  fi
  return "$rc"
}

# step_wait NAME: a step step_check has reaped already is not waited for again: its status stands.
step_wait() {
  local name=$1 rc=0
  if [ -n "${STEP_RC[$name]+set}" ]; then return "${STEP_RC[$name]}"; fi
  if [ -z "${STEP_PID[$name]+set}" ]; then echo "step_wait: no step $name was started" >&2; return 1; fi
  wait "${STEP_PID[$name]}" || rc=$?
  unset "STEP_PID[$name]"
  STEP_RC[$name]=$rc
  printf '\n-- %s (%s) --\n' "$name" "$(step_log "$name")"
  cat "$(step_log "$name")"
  step_done "$name" "$rc"
}

# step_check: a background step that has ended is reaped now, so that a failure ends the run at once.
step_check() {
  local name
  for name in "${!STEP_PID[@]}"; do
    kill -0 "${STEP_PID[$name]}" 2>/dev/null || step_wait "$name"
  done
}

step() {
  local name=$1 rc=0
  step_check
  step_start "$@"
  tail -n +1 -f --pid="${STEP_PID[$name]}" "$(step_log "$name")"
  wait "${STEP_PID[$name]}" || rc=$?
  unset "STEP_PID[$name]"
  STEP_RC[$name]=$rc
  step_done "$name" "$rc"
}

# kill_tree PID: ends PID and its descendants (children first listed, all signalled before waiting).
kill_tree() {
  local pid=$1 child
  for child in $(ps -o pid= --ppid "$pid" 2>/dev/null); do kill_tree "$child"; done
  kill "$pid" 2>/dev/null || true
}

ci_exit() {
  local rc=$? name hook start end cpu total
  set +e
  for name in "${!STEP_PID[@]}"; do
    log "$name: still running at exit: stopped; the end of its log:"
    kill_tree "${STEP_PID[$name]}"
    wait "${STEP_PID[$name]}" 2>/dev/null
    [ ! -f "$CI_LOGS/$name.time" ] || sed -i 's/^[0-9]* /stopped /' "$CI_LOGS/$name.time"
    tail -40 "$(step_log "$name")"
  done
  for hook in "${EXIT_HOOKS[@]}"; do
    eval "$hook" || { [ "$rc" != 0 ] || rc=1; }
  done
  total=$(ci_secs)
  printf '\n== step times (this run: %s; logs in %s)\n' "$( [ "$rc" = 0 ] && echo passed || echo "FAILED, exit $rc")" "$CI_LOGS"
  printf '   %-14s %7s %7s %7s  %s\n' step start wall CPU result
  for name in "${STEP_ORDER[@]}"; do
    if [ -f "$CI_LOGS/$name.time" ]; then
      read -r src start end cpu < "$CI_LOGS/$name.time"
      printf '   %-14s %7s %7s %7s  %s\n' "$name" "+$(mmss "$start")" "$(mmss $((end - start)))" "$(mmss "$cpu")" \
        "$(case $src in 0) echo ok ;; stopped) echo "stopped at exit" ;; *) echo "exit $src" ;; esac)"
    else
      printf '   %-14s %7s\n' "$name" "(not finished)"
    fi
  done
  times > "$CI_LOGS/.cpu"
  printf '   %-14s %7s %7s %7s  load average at the end: %s\n' total "" "$(mmss "$total")" "$(mmss "$(cpu_of "$CI_LOGS/.cpu")")" \
    "$(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null)"
  exit "$rc"
}
trap ci_exit EXIT
