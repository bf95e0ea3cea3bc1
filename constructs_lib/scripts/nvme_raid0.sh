#!/usr/bin/env bash
# Instance-store NVMe -> one scratch file system, on every boot (stop/start wipes instance store).
#   0 disks: log and do nothing.  1 disk: format and mount it.  2+: mdadm RAID 0 over all of them.
# Idempotent: a second run, or a reboot that kept the data, leaves exactly one array and one mount.
# Settings (environment, or /etc/dl-launcher/nvme.env written by the launch template):
#   MOUNT_POINT   where the scratch file system goes              (default /scratch)
#   DLAMI_MOUNT   replace | reuse: what to do when the Deep Learning AMI's dlami-nvme.service
#                 already put the disks under /opt/dlami/nvme (LVM)  (default replace)
#   DEV_ROOT      where by-id links live (tests point it at a fake tree) (default /dev/disk/by-id)
#   CHUNK_KIB     RAID 0 chunk size in KiB                          (default 512)
#   ARRAY, DLAMI_DIR  device and directory names, overridable for tests
set -euo pipefail

MOUNT_POINT=${MOUNT_POINT:-/scratch}
DLAMI_MOUNT=${DLAMI_MOUNT:-replace}
DEV_ROOT=${DEV_ROOT:-/dev/disk/by-id}
CHUNK_KIB=${CHUNK_KIB:-512}
DLAMI_DIR=${DLAMI_DIR:-/opt/dlami/nvme}
ARRAY=${ARRAY:-/dev/md/scratch}
LABEL=scratch

log() { echo "dl-nvme-raid0: $*"; }

case "$DLAMI_MOUNT" in replace|reuse) ;; *) log "DLAMI_MOUNT must be replace or reuse, got '$DLAMI_MOUNT'"; exit 2 ;; esac

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

mounted() { mountpoint -q "$MOUNT_POINT"; }

finish() {
  chmod 1777 "$MOUNT_POINT"  # sticky and world-writable, like /tmp
  log "$MOUNT_POINT ready on $1 ($count instance-store disk(s))"
  exit 0
}

if [ "$count" -eq 0 ]; then
  log "no instance-store NVMe disks on this instance type; nothing to do"
  exit 0
fi

mkdir -p "$MOUNT_POINT"

# The DLAMI's own service may have claimed the disks first.
if mountpoint -q "$DLAMI_DIR" 2>/dev/null; then
  if [ "$DLAMI_MOUNT" = reuse ]; then
    if ! mounted; then mount --bind "$DLAMI_DIR" "$MOUNT_POINT"; fi
    finish "$DLAMI_DIR (the DLAMI's LVM volume, bind-mounted)"
  fi
  log "releasing $DLAMI_DIR from dlami-nvme.service to build a striped array"
  systemctl stop dlami-nvme.service || true
  systemctl disable dlami-nvme.service || true
  umount "$DLAMI_DIR"
  lvchange -an vg.01 || true
  vgremove -f vg.01 || true
  for d in "${disks[@]}"; do pvremove -ff -y "$d" || true; done
fi

if mounted; then
  finish "$(findmnt -n -o SOURCE "$MOUNT_POINT" 2>/dev/null || echo existing mount)"
fi

mount_dlami_alias() {
  # Keep /opt/dlami/nvme working for tools that expect it.
  if [ -d "$(dirname "$DLAMI_DIR")" ] && ! mountpoint -q "$DLAMI_DIR" 2>/dev/null; then
    mkdir -p "$DLAMI_DIR" && mount --bind "$MOUNT_POINT" "$DLAMI_DIR" || true
  fi
}

if [ "$count" -eq 1 ]; then
  dev=${disks[0]}
  if ! blkid -L "$LABEL" >/dev/null 2>&1; then
    mkfs.xfs -f -L "$LABEL" "$dev"
  fi
  mount -o noatime "$dev" "$MOUNT_POINT"
  mount_dlami_alias
  finish "$dev"
fi

# Two or more: reuse an array that survived a reboot, else create one.
if [ ! -e "$ARRAY" ]; then
  mdadm --assemble --scan >/dev/null 2>&1 || true
fi
if [ ! -e "$ARRAY" ]; then
  mdadm --create "$ARRAY" --name="$LABEL" --level=0 --chunk="$CHUNK_KIB" --raid-devices="$count" \
    --force --run "${disks[@]}"
fi
if ! blkid -L "$LABEL" >/dev/null 2>&1; then
  # Stripe-aligned: stripe unit = chunk, stripe width = number of disks.
  mkfs.xfs -f -L "$LABEL" -d "su=${CHUNK_KIB}k,sw=${count}" "$ARRAY"
fi
mount -o noatime "$ARRAY" "$MOUNT_POINT"
mount_dlami_alias
finish "$ARRAY (RAID 0, ${CHUNK_KIB} KiB chunks)"
