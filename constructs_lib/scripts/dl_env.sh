# Sourced by dl_job.sh and dl_torchrun.sh: the node's settings as environment variables.
# shellcheck shell=bash
dl_load_env() {
  local f
  for f in /etc/dl-launcher/node.env /etc/dl-launcher/efa.env /etc/dl-launcher/job.env \
           /etc/dl-launcher/resume.env /etc/dl-launcher/rendezvous.env; do
    # shellcheck disable=SC1090  # env files written at boot
    if [ -f "$f" ]; then set -a; . "$f"; set +a; fi
  done
}
