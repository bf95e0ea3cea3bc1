#!/bin/bash
# Starts the CloudWatch agent with this node's configuration (the stack's SSM parameter named by
# DL_CWAGENT_PARAMETER, or DL_CWAGENT_CONFIG_FILE written here from node.env by `dl_runtime.sh
# cwagent-config`: runtime/cwagent_config.py, the same function), installing the agent first
# where the AMI lacks it, from AWS's documented download location. Run by dl-monitor.service
# before the monitor. It never fails the unit: monitoring must not keep anything else from
# running; a problem is written to health.d/cwagent (degraded) and the monitor still starts.
# Running it again changes nothing (fetch-config replaces the agent's config with the same one).
# Hooks for tests: DL_CWAGENT_CTL, DL_CWAGENT_URL_BASE, and the contract's directory variables.

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source-path=SCRIPTDIR source=contract.sh
. "$here/contract.sh"
ctl=${DL_CWAGENT_CTL:-/opt/aws/amazon-cloudwatch-agent/bin/amazon-cloudwatch-agent-ctl}
url_base=${DL_CWAGENT_URL_BASE:-https://amazoncloudwatch-agent.s3.amazonaws.com}

log() { echo "dl-cwagent: $*"; }
health() {  # LEVEL MESSAGE
  mkdir -p "$DL_HEALTH_DIR" && echo "$*" > "$DL_HEALTH_DIR/cwagent"
  log "$*"
}

install_agent() {
  local arch pkg tmp
  case "$(uname -m)" in
    x86_64) arch=amd64 ;;
    aarch64) arch=arm64 ;;
    *) log "no CloudWatch agent package for $(uname -m)"; return 1 ;;
  esac
  tmp=$(mktemp -d) || return 1
  # Bounded, so that the unit's start (TimeoutStartSec) never runs out here: a slow download is
  # a failed install (degraded), not a monitor that never starts.
  local get=(curl -fsSL --retry 3 --retry-max-time 90 --connect-timeout 10 --max-time 90 -o)
  if command -v dpkg > /dev/null; then
    pkg="$tmp/amazon-cloudwatch-agent.deb"
    # dpkg does not wait for its lock (held at boot by cloud-init or unattended-upgrades): try again.
    "${get[@]}" "$pkg" "$url_base/ubuntu/$arch/latest/amazon-cloudwatch-agent.deb" &&
      { dpkg -i -E "$pkg" || { sleep 15; dpkg -i -E "$pkg"; } || { sleep 30; dpkg -i -E "$pkg"; }; }
  elif command -v rpm > /dev/null; then
    pkg="$tmp/amazon-cloudwatch-agent.rpm"
    "${get[@]}" "$pkg" "$url_base/amazon_linux/$arch/latest/amazon-cloudwatch-agent.rpm" && rpm -U "$pkg"
  else
    log "neither dpkg nor rpm on this node"
    false
  fi
  local rc=$?
  rm -rf "$tmp"
  return $rc
}

# The stack's SSM parameter when node.env names one (the agent fetches it with the node's role),
# else a configuration written here from node.env.
if [ -n "${DL_CWAGENT_PARAMETER:-}" ]; then
  config_source="ssm:$DL_CWAGENT_PARAMETER"
elif bash "$here/dl_runtime.sh" cwagent-config --out "$DL_CWAGENT_CONFIG_FILE"; then
  config_source="file:$DL_CWAGENT_CONFIG_FILE"
else
  health degraded "could not write the agent's configuration $DL_CWAGENT_CONFIG_FILE: no node metrics"
  exit 0
fi
if [ ! -x "$ctl" ]; then
  log "the CloudWatch agent is not installed: installing it"
  if ! install_agent || [ ! -x "$ctl" ]; then
    health degraded "the CloudWatch agent could not be installed: no GPU, CPU or disk metrics from this node (the idle guard will not stop it)"
    exit 0
  fi
fi
if "$ctl" -a fetch-config -m ec2 -s -c "$config_source"; then
  health ok "CloudWatch agent running with $config_source"
else
  health degraded "the CloudWatch agent did not start with $config_source: see /opt/aws/amazon-cloudwatch-agent/logs"
fi
exit 0
