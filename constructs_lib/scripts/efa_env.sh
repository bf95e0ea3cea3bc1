#!/usr/bin/env bash
# Writes the EFA / NCCL environment for jobs on this node, from what the AMI really ships.
# Current DLAMIs carry aws-ofi-nccl >= 1.7 with libfabric >= 1.18, so the legacy variables
# (FI_PROVIDER, FI_EFA_USE_DEVICE_RDMA, NCCL_PROTO, FI_EFA_FORK_SAFE) are not set for CUDA:
# the plugin sets what it needs. The Neuron runtime still documents FI_PROVIDER and friends.
# Settings: SDK (cuda | neuron, default cuda); ROOT (a prefix for tests, default empty).
# Values are double-quoted so that the file serves both systemd (EnvironmentFile=) and bash.
set -euo pipefail

SDK=${SDK:-cuda}
ROOT=${ROOT:-}
ENV_FILE="$ROOT/etc/dl-launcher/efa.env"
PROFILE_FILE="$ROOT/etc/profile.d/dl-efa.sh"

libs=()
for d in "$ROOT/opt/amazon/efa/lib" "$ROOT/opt/amazon/efa/lib64"; do
  [ -d "$d" ] && libs+=("${d#"$ROOT"}")
done
# The OFI NCCL plugin: Ubuntu packages put it under the multiarch directory, older installs elsewhere.
for d in "$ROOT/opt/amazon/ofi-nccl/lib/$(uname -m)-linux-gnu" "$ROOT/opt/amazon/ofi-nccl/lib" "$ROOT/opt/aws-ofi-nccl/lib"; do
  if [ -d "$d" ]; then libs+=("${d#"$ROOT"}"); break; fi
done
if [ ! -d "$ROOT/opt/amazon/efa" ]; then
  echo "dl-efa-env: no EFA software under /opt/amazon/efa: use a Deep Learning AMI or install the EFA driver" >&2
fi

mkdir -p "$(dirname "$ENV_FILE")" "$(dirname "$PROFILE_FILE")"
{
  echo "# written by dl-launcher at boot; read by the job's systemd unit (EnvironmentFile=)"
  if [ ${#libs[@]} -gt 0 ]; then
    (IFS=:; echo "LD_LIBRARY_PATH=\"${libs[*]}\"")
  fi
  # NCCL's bootstrap runs over TCP on the ENA interface; keep it off loopback and docker bridges.
  echo 'NCCL_SOCKET_IFNAME="^lo,docker"'
  case "$SDK" in
    cuda)
      # Fail loudly instead of falling back to TCP sockets when the OFI plugin is missing.
      echo 'NCCL_NET="AWS Libfabric"'
      ;;
    neuron)
      echo "FI_PROVIDER=efa"
      echo "FI_EFA_USE_DEVICE_RDMA=1"
      echo "FI_EFA_FORK_SAFE=1"
      ;;
    *) echo "dl-efa-env: SDK must be cuda or neuron, got '$SDK'" >&2; exit 2 ;;
  esac
} > "$ENV_FILE"

# Interactive shells (SSM sessions) get the same settings.
{
  echo "# written by dl-launcher"
  echo "set -a"
  echo ". /etc/dl-launcher/efa.env"
  echo "set +a"
} > "$PROFILE_FILE"
echo "dl-efa-env: wrote ${ENV_FILE#"$ROOT"} for $SDK"
