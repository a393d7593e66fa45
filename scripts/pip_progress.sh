# Sourced by the set-up scripts: pip_install VENV ARGS... runs a quiet pip with a line every 15 s while it works
# and shows pip's full log only if it fails; require_free_space stops before an install that cannot fit.

# require_free_space DIR GIB WHAT: pip fails late and cryptically on a full disk ("[Errno 28] No space left on
# device" after minutes of downloads), so say up front where, how much and what to do.
require_free_space() {
  local dir="$1" need="$2" what="$3" free
  free="$(df -Pk "$dir" 2>/dev/null | awk 'NR == 2 { print int($4 / 1048576) }')"
  if [ -n "$free" ] && [ "$free" -lt "$need" ]; then
    echo "[setup] $what needs about $need GiB free at $dir; that disk has $free GiB. Free some space there" \
      "(old clones, virtualenvs, \$TMPDIR) or set the variable named above to a folder on a roomier disk." >&2
    exit 1
  fi
}

pip_install() {
  local venv="$1"; shift
  local log pid status waited=0; log="$(mktemp)"
  "$venv/bin/python" -m pip install -q "$@" >"$log" 2>&1 &
  pid=$!
  while kill -0 "$pid" 2>/dev/null; do
    sleep 1; waited=$((waited + 1))
    if [ $((waited % 15)) -eq 0 ]; then echo "[setup] still installing (${waited} s for this step)"; fi
  done
  wait "$pid" && status=0 || status=$?
  if [ "$status" -ne 0 ]; then
    cat "$log" >&2; echo "[setup] pip install $* failed" >&2
    if grep -q "No space left on device" "$log"; then
      echo "[setup] the disk filled up: free space at $venv and ${TMPDIR:-/tmp} (pip unpacks there), then rerun" >&2
    fi
    exit 1
  fi
  rm -f "$log"
}
