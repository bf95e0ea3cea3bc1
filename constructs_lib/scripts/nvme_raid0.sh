#!/usr/bin/env bash
# Instance-store NVMe -> one scratch file system, on every boot (stop/start wipes instance store).
#   0 disks: a plain directory on the root volume.  1 disk: format and mount it.
#   2+: mdadm RAID 0 over all of them.
# Idempotent: a second run, or a reboot that kept the data, leaves exactly one array and one mount.
# Never strands the node: if the array, the file system or the mount cannot be made, MOUNT_POINT
# becomes a directory on the root volume, one "DEGRADED:" line goes to stderr and the script still
# exits 0, so that the units ordered after it (the training job) start.
# Reports "ok|degraded|failed <message>" in $DL_RUN_DIR/health.d/raid (runtime/contract.py).
# Settings (environment, or /etc/dl-launcher/nvme.env written by the launch template):
#   MOUNT_POINT   where the scratch file system goes              (default /scratch)
#   DLAMI_MOUNT   replace | reuse: what to do when the Deep Learning AMI's dlami-nvme.service
#                 already put the disks under /opt/dlami/nvme (LVM)  (default replace)
#   DEV_ROOT      where by-id links live (tests point it at a fake tree) (default /dev/disk/by-id)
#   CHUNK_KIB     RAID 0 chunk size in KiB                          (default 512)
#   DL_RUN_DIR    this boot's state, health.d/ in it              (default /run/dl-launcher)
#   ARRAY, DLAMI_DIR  device and directory names, overridable for tests
set -euo pipefail

MOUNT_POINT=${MOUNT_POINT:-/scratch}
DLAMI_MOUNT=${DLAMI_MOUNT:-replace}
DEV_ROOT=${DEV_ROOT:-/dev/disk/by-id}
CHUNK_KIB=${CHUNK_KIB:-512}
DLAMI_DIR=${DLAMI_DIR:-/opt/dlami/nvme}
ARRAY=${ARRAY:-/dev/md/scratch}
HEALTH_FILE=${DL_RUN_DIR:-/run/dl-launcher}/health.d/raid
LABEL=scratch

log() { echo "dl-nvme-raid0: $*"; }

# One line for the node's status (contract.py: health_dir), written once the outcome is known.
# Never fatal: scratch matters more than the report about it.
health() {
  if ! { mkdir -p "$(dirname "$HEALTH_FILE")" && echo "$*" > "$HEALTH_FILE"; }; then
    log "could not write $HEALTH_FILE"
  fi
}

fail() {  # exit status, reason
  local status=$1; shift
  echo "dl-nvme-raid0: FAILED: $*" >&2
  health failed "$*"
  exit "$status"
}

plain_dir() { mkdir -p "$MOUNT_POINT" && chmod 1777 "$MOUNT_POINT"; }  # sticky and world-writable, like /tmp

# Slow scratch beats no scratch: the job still starts, and the operator sees why it is slow.
degrade() {
  plain_dir || fail 1 "$1, and $MOUNT_POINT could not be made on the root volume either"
  echo "dl-nvme-raid0: DEGRADED: $1: $MOUNT_POINT is a plain directory on the root EBS volume," \
       "slower and smaller than the instance-store disks" >&2
  health degraded "$1; $MOUNT_POINT is on the root EBS volume"
  exit 0
}

finish() {
  chmod 1777 "$MOUNT_POINT" || fail 1 "chmod 1777 $MOUNT_POINT failed on $1"
  log "$MOUNT_POINT ready on $1 ($count instance-store disk(s))"
  health ok "$MOUNT_POINT on $1"
  exit 0
}

# The device mounted at a directory, as findmnt shows it, or "" if none. A bind mount shows the
# device it comes from, so our own bind at DLAMI_DIR reads as our array or disk. Mounts stack:
# the last one listed is the one in use.
source_of() { findmnt -n -o SOURCE --mountpoint "$1" 2>/dev/null | tail -n 1 || true; }

# dlami-nvme.service mounts an LVM volume (/dev/mapper/vg.01-lv_ephemeral); this script only ever
# mounts an md array or a bare disk there. Anything else at DLAMI_DIR is left alone.
is_dlami_volume() { case $1 in /dev/mapper/*|/dev/dm-*) return 0 ;; *) return 1 ;; esac; }

# Keep /opt/dlami/nvme working for tools that expect it, unless something is there already.
mount_dlami_alias() {
  if [ ! -d "$(dirname "$DLAMI_DIR")" ] || [ -n "$(source_of "$DLAMI_DIR")" ]; then return 0; fi
  if ! { mkdir -p "$DLAMI_DIR" && mount --bind "$MOUNT_POINT" "$DLAMI_DIR"; }; then
    log "could not bind $MOUNT_POINT at $DLAMI_DIR; tools that use it write to the root volume"
  fi
}

case "$DLAMI_MOUNT" in replace|reuse) ;; *) fail 2 "DLAMI_MOUNT must be replace or reuse, got '$DLAMI_MOUNT'" ;; esac

# Instance-store disks only: EBS volumes are "Amazon_Elastic_Block_Store". One device may have
# several links (namespace suffixes, partitions); resolve and de-duplicate.
disks=()
while IFS= read -r dev; do
  [ -n "$dev" ] && disks+=("$dev")
done < <(
  for link in "$DEV_ROOT"/nvme-Amazon_EC2_NVMe_Instance_Storage_*; do
    [ -e "$link" ] || continue
    case "$link" in *-part*) continue ;; esac
    readlink -f "$link"
  done | sort -u
)
count=${#disks[@]}

if [ "$count" -eq 0 ]; then
  # The job still runs in MOUNT_POINT (DL_SCRATCH): give it the root volume.
  plain_dir || fail 1 "no instance-store NVMe disks, and $MOUNT_POINT could not be made on the root volume"
  log "no instance-store NVMe disks on this instance type; $MOUNT_POINT is a directory on the root volume"
  health ok "no instance-store NVMe disks; $MOUNT_POINT is a directory on the root volume"
  exit 0
fi

# Already done by an earlier run of this boot (or by hand): nothing to release, build or mount.
scratch_src=$(source_of "$MOUNT_POINT")
if [ -n "$scratch_src" ]; then
  mount_dlami_alias
  finish "$scratch_src"
fi

mkdir -p "$MOUNT_POINT" || degrade "mkdir $MOUNT_POINT failed"

# The DLAMI's own service may have claimed the disks first.
dlami_src=$(source_of "$DLAMI_DIR")
if is_dlami_volume "$dlami_src"; then
  if [ "$DLAMI_MOUNT" = reuse ]; then
    mount --bind "$DLAMI_DIR" "$MOUNT_POINT" || degrade "mount --bind $DLAMI_DIR $MOUNT_POINT failed (exit $?)"
    finish "$dlami_src (the DLAMI's LVM volume, bind-mounted from $DLAMI_DIR)"
  fi
  log "releasing $DLAMI_DIR ($dlami_src) from dlami-nvme.service to build a striped array"
  systemctl stop dlami-nvme.service || true
  if [ -n "$(source_of "$DLAMI_DIR")" ]; then
    umount "$DLAMI_DIR" || degrade "umount $DLAMI_DIR failed (exit $?), the DLAMI's volume stays there"
  fi
  # Only now: had the volume stayed mounted, the service should set it up again next boot.
  systemctl disable dlami-nvme.service || true
  lvchange -an vg.01 || true
  vgremove -f vg.01 || true
  for d in "${disks[@]}"; do pvremove -ff -y "$d" || true; done
fi

if [ "$count" -eq 1 ]; then
  dev=${disks[0]}
  what=$dev
  if ! blkid -L "$LABEL" >/dev/null 2>&1; then
    mkfs.xfs -f -L "$LABEL" "$dev" || degrade "mkfs.xfs on $dev failed (exit $?)"
  fi
else
  # Two or more: reuse an array that survived a reboot, else create one.
  dev=$ARRAY
  what="$ARRAY (RAID 0, ${CHUNK_KIB} KiB chunks)"
  if [ ! -e "$ARRAY" ]; then
    mdadm --assemble --scan >/dev/null 2>&1 || true
  fi
  if [ ! -e "$ARRAY" ]; then
    mdadm --create "$ARRAY" --name="$LABEL" --level=0 --chunk="$CHUNK_KIB" --raid-devices="$count" \
      --force --run "${disks[@]}" || degrade "mdadm --create $ARRAY over $count disks failed (exit $?)"
  fi
  if ! blkid -L "$LABEL" >/dev/null 2>&1; then
    # Stripe-aligned: stripe unit = chunk, stripe width = number of disks.
    mkfs.xfs -f -L "$LABEL" -d "su=${CHUNK_KIB}k,sw=${count}" "$ARRAY" ||
      degrade "mkfs.xfs on $ARRAY failed (exit $?)"
  fi
fi
mount -o noatime "$dev" "$MOUNT_POINT" || degrade "mount $dev $MOUNT_POINT failed (exit $?)"
mount_dlami_alias
finish "$what"
