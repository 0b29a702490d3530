# Sourced by the scripts in this directory as their first step: with -h or
# --help as the first argument, prints the calling script's header comment
# (the lines after #!, up to the first line that is not a comment) and
# exits 0, before any build or install runs.
if [[ "${1:-}" == -h || "${1:-}" == --help ]]; then
  awk 'NR > 1 && !/^#/ {exit} NR > 1 {sub(/^# ?/, ""); print}' "$0"
  exit 0
fi
