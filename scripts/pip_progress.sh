# Sourced by the set-up scripts: pip_install VENV ARGS... runs a quiet pip with a line every 15 s while it works
# and shows pip's full log only if it fails.
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
    cat "$log" >&2; echo "[setup] pip install $* failed" >&2; exit 1
  fi
  rm -f "$log"
}
