# Shell helpers of the launch scripts (sourced by tpu_pod.sh, and by slurm.sh for a dry run).

# One word for the shell: unchanged if plainly safe, else single-quoted (double-quoted when it
# holds a single quote and nothing that double quotes would expand; bash's $'...' when it holds
# a newline or another control character).
quote() {
  local s=$1 sq="'" esc="'\\''"
  if [[ -n "$s" && "$s" =~ ^[A-Za-z0-9_./:=@%+,-]+$ ]]; then
    printf '%s' "$s"
  elif [[ "$s" == *[[:cntrl:]]* ]]; then
    printf '%q' "$s" # $'...', so that the command stays on one line (bash)
  elif [[ "$s" != *"'"* ]]; then
    printf "'%s'" "$s"
  elif [[ "$s" != *[\"\$\`\\!]* ]]; then
    printf '"%s"' "$s"
  else
    printf "'%s'" "${s//"$sq"/"$esc"}"
  fi
}

# The words, quoted and joined by spaces.
join_quoted() {
  local out=() w
  for w in "$@"; do
    out+=("$(quote "$w")")
  done
  printf '%s' "${out[*]}"
}
