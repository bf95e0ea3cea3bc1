"""The boot health gate's checks (health_gate.py runs them): each a function of what the node
should have (Expect) and the tools that look (Tools), returning one Finding with a level and,
when it is not ok, what to do. None raises: a tool that cannot run is a finding too.

The tools and what each is read for (their own documentation):
- `nvidia-smi -L` (GPUs listed, node_probes.gpus_listed); `nvidia-smi --query-gpu=...` for the
  volatile uncorrected ECC count; `nvidia-smi --query-remapped-rows=...` for pending and failed row
  remaps (NVIDIA, GPU memory error management: a pending remap needs a GPU reset, a failed one
  means the GPU is out of spare rows).
- The kernel log of this boot (`journalctl --dmesg`), for the hardware XIDs node_probes knows.
- `dcgmi diag -r 1|2|3 -j` (NVIDIA DCGM, dcgmi-diag: level 1 "normally lasting seconds", 2
  "approximately two minutes", 3 "approximately 15 minutes"); its JSON lists test categories,
  tests and per-GPU results with a status; 3.x names the document "DCGM GPU Diagnostic", 4.x
  "DCGM Diagnostic" (DCGM 4.0 release notes). A failed result, or a runtime_error, fails the node.
- EFA: the devices under /sys/class/infiniband (one per EFA interface), `fi_info -p efa -t
  FI_EP_RDM` (libfabric lists the EFA provider's RDM endpoints; it exits non-zero when there is
  none) and a loopback `fi_pingpong -p efa -e rdm` server and client on this node, both from the
  EFA installer in /opt/amazon/efa/bin (AWS EFA user guide). Exit statuses only: no output parsed.
- The scratch RAID's size (statvfs) against the instance-store NVMe the catalog gives the type.
"""
from __future__ import annotations

import json
import os
import shlex
import subprocess
import time
from dataclasses import dataclass
from typing import Callable, Mapping, Optional

from . import contract
from .node_probes import HARDWARE_XIDS, XID_LINE, gpus_listed

LEVELS = ("ok", "degraded", "failed")  # contract.HEALTH_LEVELS, in order of how bad
EFA_BIN = contract.EFA_BIN_DEFAULT
# statvfs sees the file system, not the disks: XFS's own metadata and the RAID's rounding take a
# few percent of what the disks hold (GB as the catalog gives them: 10^9 bytes).
SCRATCH_SHARE = 0.9
DCGM_TIMEOUT = {1: 300, 2: 900, 3: 3600}  # seconds: generous beside NVIDIA's stated times, never unbounded


@dataclass(frozen=True)
class Finding:
    check: str
    level: str
    message: str
    remedy: str = ""

    def line(self) -> str:
        return f"{self.check} {self.level}: {self.message}" + (f" ({self.remedy})" if self.remedy else "")


@dataclass(frozen=True)
class Expect:
    """What this node should have, from node.env (the catalog's facts at synth)."""
    gpus: int = 0
    efa: int = 0
    scratch_gb: int = 0
    level: str = contract.HEALTH_CHECK_DEFAULT
    scratch: str = ""

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> "Expect":
        def count(name: str) -> int:
            try:
                return max(0, int(env.get(name) or "0"))
            except ValueError:
                return 0
        level = env.get(contract.ENV_HEALTH_CHECK) or contract.HEALTH_CHECK_DEFAULT
        return cls(gpus=count("DL_EXPECTED_GPUS"), efa=count(contract.ENV_EXPECTED_EFA),
                   scratch_gb=count(contract.ENV_EXPECTED_SCRATCH_GB),
                   level=level if level in contract.HEALTH_CHECKS else contract.HEALTH_CHECK_DEFAULT,
                   scratch=contract.scratch_dir())


@dataclass(frozen=True)
class Tools:
    """The commands each check runs (tests point them at stand-ins that replay recorded output)."""
    nvidia_smi: str = "nvidia-smi"
    dcgmi: str = "dcgmi"
    fi_info: str = f"{EFA_BIN}/fi_info"
    fi_pingpong: str = f"{EFA_BIN}/fi_pingpong"
    kernel_log: str = "journalctl --dmesg --no-pager --output cat"
    infiniband: str = contract.INFINIBAND_DIR_DEFAULT

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> "Tools":
        """The real node's tools, or where node.env points the EFA checks (a simulated node's)."""
        efa_bin = env.get(contract.ENV_EFA_BIN) or EFA_BIN
        return cls(fi_info=f"{efa_bin}/fi_info", fi_pingpong=f"{efa_bin}/fi_pingpong",
                   infiniband=env.get(contract.ENV_INFINIBAND_DIR) or contract.INFINIBAND_DIR_DEFAULT)


def _run(argv: list[str], timeout: float) -> tuple[Optional[int], str, str]:
    """(exit status or None when it could not run or ran over, stdout, why it did not run)."""
    try:
        out = subprocess.run(argv, capture_output=True, text=True, errors="replace", timeout=timeout)
    except OSError as e:
        return None, "", f"cannot run {argv[0]}: {e.strerror or e}"
    except subprocess.TimeoutExpired:
        return None, "", f"{' '.join(argv)} ran over {timeout:.0f} s"
    return out.returncode, out.stdout, (out.stderr or "").strip()[-300:]


# ---- GPUs -----------------------------------------------------------------------------------------
def gpu_count(e: Expect, t: Tools) -> Finding:
    listed = gpus_listed(t.nvidia_smi)
    if listed is None:
        return Finding("gpu-count", "failed", f"`{t.nvidia_smi} -L` failed: the driver sees no GPU",
                       "the NVIDIA driver is not loaded or every GPU is lost")
    if e.gpus and listed < e.gpus:
        return Finding("gpu-count", "failed", f"{listed} of {e.gpus} GPUs listed by nvidia-smi",
                       "a GPU has fallen off the bus: the node is replaced")
    return Finding("gpu-count", "ok", f"{listed} GPUs listed" + (f" of {e.gpus}" if e.gpus else ""))


def _csv_rows(text: str, header: bool) -> list[list[str]]:
    rows = [[c.strip() for c in line.split(",")] for line in text.splitlines() if line.strip()]
    return rows[1:] if header else rows


def ecc_errors(e: Expect, t: Tools) -> Finding:
    rc, out, why = _run(shlex.split(t.nvidia_smi) + ["--query-gpu=pci.bus_id,ecc.errors.uncorrected.volatile.total",
                                                     "--format=csv,noheader"], 60)
    if rc != 0:
        return Finding("gpu-ecc", "degraded", f"ECC counters not read ({why or f'exit {rc}'})")
    bad = [f"{row[0]}: {row[1]}" for row in _csv_rows(out, header=False)
           if len(row) >= 2 and row[1].isdigit() and int(row[1]) > 0]
    if bad:
        return Finding("gpu-ecc", "failed", "uncorrected ECC errors since the driver loaded on " + ", ".join(bad),
                       "uncorrectable GPU memory errors: the node is replaced")
    return Finding("gpu-ecc", "ok", "no uncorrected ECC error")


REMAP_QUERY = ("--query-remapped-rows=gpu_uuid,remapped_rows.correctable,remapped_rows.uncorrectable,"
               "remapped_rows.pending,remapped_rows.failure")


def row_remaps(e: Expect, t: Tools) -> Finding:
    rc, out, why = _run(shlex.split(t.nvidia_smi) + [REMAP_QUERY, "--format=csv"], 60)
    if rc != 0:  # GPUs before Ampere have no row remapper: nvidia-smi says "not supported"
        return Finding("gpu-row-remap", "degraded", f"row remaps not read ({why or f'exit {rc}'})")
    pending, failed = [], []
    for row in _csv_rows(out, header=True):
        if len(row) < 5:
            continue
        if row[4].lower() == "yes":
            failed.append(row[0])
        elif row[3].lower() == "yes":
            pending.append(row[0])
    if failed:
        return Finding("gpu-row-remap", "failed", f"row remapping failed on {', '.join(failed)}",
                       "the GPU is out of spare memory rows: the node is replaced")
    if pending:
        return Finding("gpu-row-remap", "failed", f"row remap pending on {', '.join(pending)}",
                       "a pending remap needs a GPU reset; a fresh node is faster: it is replaced")
    return Finding("gpu-row-remap", "ok", "no pending or failed row remap")


def boot_xids(e: Expect, t: Tools) -> Finding:
    rc, out, why = _run(shlex.split(t.kernel_log), 60)
    if rc is None:
        return Finding("gpu-xid", "degraded", f"the kernel log was not read ({why})")
    for line in out.splitlines():
        m = XID_LINE.search(line)
        if m and int(m.group("xid")) in HARDWARE_XIDS:
            x = int(m.group("xid"))
            return Finding("gpu-xid", "failed", f"XID {x} ({HARDWARE_XIDS[x]}) on GPU {m.group('bus').strip() or '?'} "
                           "since boot", "a hardware XID: the node is replaced")
    return Finding("gpu-xid", "ok", "no hardware XID since boot")


def dcgm_verdict(text: str) -> tuple[str, str]:
    """(level, why) from `dcgmi diag -j` output (text before the document, as dcgmi prints
    "Successfully ran diagnostic for group." first, is skipped)."""
    start = text.find("{")
    try:
        doc = json.loads(text[start:]) if start >= 0 else None
    except ValueError:
        doc = None
    if not isinstance(doc, dict):
        return "degraded", "dcgmi printed no JSON document"
    root = doc.get("DCGM GPU Diagnostic") or doc.get("DCGM Diagnostic")
    if not isinstance(root, dict):
        return "degraded", "dcgmi's document has no diagnostic"
    if root.get("runtime_error"):
        return "failed", f"DCGM could not run its diagnostic: {root['runtime_error']}"
    failed, ran = [], 0
    for category in root.get("test_categories") or []:
        for test in (category or {}).get("tests") or []:
            if not isinstance(test, dict):
                continue
            for result in test.get("results") or []:
                if not isinstance(result, dict):
                    continue
                ran += 1
                if str(result.get("status", "")).lower() == "fail":
                    gpu = result.get("gpu_ids", result.get("gpu_id", result.get("entity_id", "?")))
                    warnings = [w.get("warning", "") if isinstance(w, dict) else str(w)
                                for w in result.get("warnings") or []]
                    failed.append(f"{test.get('name')} on GPU {gpu}" + (f": {warnings[0]}" if warnings else ""))
    if failed:
        return "failed", "; ".join(failed)
    if not ran:
        return "degraded", "dcgmi reported no test result"
    return "ok", f"{ran} results passed"


def dcgm_diag(e: Expect, t: Tools) -> Finding:
    level = contract.HEALTH_CHECKS[e.level]
    started = time.monotonic()
    rc, out, why = _run(shlex.split(t.dcgmi) + ["diag", "-r", str(level), "-j"], DCGM_TIMEOUT[level])
    took = time.monotonic() - started
    name = f"dcgm-diag-r{level}"
    if rc is None and not out:
        return Finding(name, "degraded", f"DCGM diagnostic not run ({why})",
                       "install DCGM (the Deep Learning AMI ships it) to have the GPUs diagnosed at boot")
    verdict, detail = dcgm_verdict(out)
    if verdict == "ok" and rc not in (0, None):
        verdict, detail = "degraded", f"dcgmi exited {rc}: {why or detail}"
    return Finding(name, verdict, f"{detail} in {took:.0f} s",
                   "a GPU failed NVIDIA's diagnostic: the node is replaced" if verdict == "failed" else "")


# ---- EFA ------------------------------------------------------------------------------------------
def efa_devices(e: Expect, t: Tools) -> Finding:
    if not e.efa:
        return Finding("efa-devices", "ok", "no EFA expected")
    try:
        devices = sorted(os.listdir(t.infiniband))
    except OSError:
        devices = []
    if len(devices) < e.efa:
        return Finding("efa-devices", "failed", f"{len(devices)} of {e.efa} EFA devices in {t.infiniband}"
                       + (f" ({', '.join(devices)})" if devices else ""), "an EFA interface is missing: the node is replaced")
    rc, _, why = _run(shlex.split(t.fi_info) + ["-p", "efa", "-t", "FI_EP_RDM"], 60)
    if rc != 0:
        return Finding("efa-devices", "failed", f"libfabric lists no EFA RDM endpoint ({why or f'exit {rc}'})",
                       "the EFA provider does not load: the node is replaced")
    return Finding("efa-devices", "ok", f"{len(devices)} EFA devices; libfabric's efa provider loads")


def efa_loopback(e: Expect, t: Tools) -> Finding:
    if not e.efa:
        return Finding("efa-loopback", "ok", "no EFA expected")
    argv = shlex.split(t.fi_pingpong) + ["-p", "efa", "-e", "rdm"]
    try:
        server = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    except OSError as ex:
        return Finding("efa-loopback", "failed", f"cannot run {argv[0]}: {ex.strerror or ex}",
                       "the EFA installer's tools are missing from this image")
    try:
        time.sleep(1.0)  # the server binds before the client sends
        rc, _, why = _run(argv + ["localhost"], 60)
        try:
            server_rc = server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server_rc = None
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
    if rc != 0 or server_rc != 0:
        return Finding("efa-loopback", "failed", f"fi_pingpong over EFA to this node failed "
                       f"(client {why or rc}, server exit {server_rc})", "EFA does not pass traffic: the node is replaced")
    return Finding("efa-loopback", "ok", "fi_pingpong over EFA to this node passed")


# ---- disk -----------------------------------------------------------------------------------------
def scratch_size(e: Expect, t: Tools) -> Finding:
    if not e.scratch_gb:
        return Finding("scratch-raid", "ok", "no instance-store RAID expected")
    try:
        st = os.statvfs(e.scratch)
    except OSError as ex:
        return Finding("scratch-raid", "failed", f"{e.scratch}: {ex.strerror or ex}", "the RAID was not mounted")
    have = st.f_blocks * st.f_frsize / 1e9
    if have < SCRATCH_SHARE * e.scratch_gb:
        return Finding("scratch-raid", "failed", f"{e.scratch} holds {have:,.0f} GB; the type's NVMe give "
                       f"{e.scratch_gb:,} GB", "an instance-store disk is missing from the RAID: the node is replaced")
    return Finding("scratch-raid", "ok", f"{e.scratch} holds {have:,.0f} GB of {e.scratch_gb:,} GB")


Check = Callable[[Expect, Tools], Finding]
GPU_CHECKS: tuple[Check, ...] = (gpu_count, ecc_errors, row_remaps, boot_xids, dcgm_diag)
EFA_CHECKS: tuple[Check, ...] = (efa_devices, efa_loopback)
DISK_CHECKS: tuple[Check, ...] = (scratch_size,)
