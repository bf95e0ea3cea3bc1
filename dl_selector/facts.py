"""The facts of one instance type, as the catalog holds them."""
from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing is not imported at run time (a cold CLI start, issue 39 item 7)
    from typing import Any, Mapping, Optional

from .record import asdict, field, record


@record(frozen=True)
class Price:
    """One type's prices in one region. On-demand and spot come from different sources at different
    times, so spot carries its own date, source and spread; "" / 0 / None mean "not recorded"."""
    on_demand: Optional[float]
    spot: Optional[float]  # the median across the AZs quoted
    as_of: str  # when the on-demand figure (and spot, unless spot_as_of says otherwise) was taken
    source: str
    note: str = ""
    spot_min: Optional[float] = None
    spot_max: Optional[float] = None
    spot_azs: int = 0  # AZs behind the spot figure; 1 is flagged: one AZ is not a market
    spot_as_of: str = ""
    spot_source: str = ""
    # Why the spot figure is suspect against its own history (spot_trust.against_history), set when a
    # new figure replaced an older one; "" otherwise.
    spot_flag: str = ""
    # The per-AZ quotes behind a live spot figure: (AZ, USD/h, the quote's own timestamp), as
    # DescribeSpotPriceHistory gave them; () for the embedded snapshot, which keeps only the spread.
    spot_quotes: tuple[tuple[str, float, str], ...] = ()

    @property
    def spot_date(self) -> str:
        return self.spot_as_of or self.as_of


@record(frozen=True)
class CapacityBlockPrice:
    """AWS's published Capacity Block for ML rate: USD per instance-hour, reserved in advance."""
    usd_per_hour: float
    as_of: str
    source: str


@record(frozen=True)
class NvmeDisks:
    count: int
    size_gb: int

    @property
    def total_gb(self) -> int:
        return self.count * self.size_gb


# Sanity bound for any bandwidth figure: 100 Tbps per instance (the largest AWS publishes is 6.4 Tbps).
MAX_NETWORK_GBPS = 100_000.0


def gb_of(gib: float) -> float:
    """GiB as EC2 reports them (2 decimals) -> the vendor's GB (InstanceFacts.accelerator_memory_gb)."""
    return float(round(gib)) if abs(gib - round(gib)) < 0.005 else round(gib * 1.073741824, 1)


@record(frozen=True)
class InstanceFacts:
    instance_type: str
    family: str
    vcpus: int
    memory_gib: float
    architectures: tuple[str, ...]
    accelerator_vendor: str
    accelerator: str
    # "gpu", "neuron" (Trainium/Inferentia) or "inference" (other inference ASICs).
    accelerator_kind: str
    # Logical accelerators the OS sees; for fractional GPUs (g6f) this is 1 with a fraction below 1.
    accelerator_count: int
    accelerator_fraction: float
    accelerator_memory_gib: float
    sdk: str
    interconnect: str
    precisions: tuple[str, ...]
    tensor_cores: bool
    efa: bool
    network_cards: int
    max_efa_interfaces: int
    # AWS's published instance figure (DescribeInstanceTypes NetworkInfo.NetworkPerformance, or the cited
    # page for retired types), never a sum over network cards; None where AWS publishes only a rating
    # such as "High". With network_burst, it is the "up to" burst figure over a lower baseline.
    network_gbps: Optional[float]
    nvme: Optional[NvmeDisks]
    regions: tuple[str, ...]
    prices: Mapping[str, Price] = field(default_factory=dict)
    neuron_cores: int = 0
    cluster_placement: bool = True
    spot_supported: bool = True
    retired: bool = False
    successors: tuple[str, ...] = ()
    specs_source: str = ""
    # AWS sells the type only as Capacity Blocks for ML (data/capacity_blocks.toml): it has no
    # on-demand or spot price anywhere, and launches only into a reserved block.
    capacity_block_only: bool = False
    capacity_block_source: str = ""
    # Published Capacity Block rates by region (data/capacity_blocks.toml), for every type that has one.
    capacity_block_prices: dict[str, CapacityBlockPrice] = field(default_factory=dict)
    # The most EFA and the most ENA (IP) bandwidth AWS states for the type, where it states them
    # separately (data/network.toml); the two share the instance's bandwidth. None: not stated.
    efa_gbps: Optional[float] = None
    ena_gbps: Optional[float] = None
    # Where network_gbps (and efa/ena) come from, with AWS's own wording of the figure.
    network_source: str = ""
    # network_gbps is an "up to" figure: a burst over a lower baseline, on network I/O credits.
    network_burst: bool = False

    @property
    def accelerator_memory_gb(self) -> float:
        """Memory per accelerator in the vendor's GB, the unit researchers quote (A10G and L4: 24 GB).
        EC2 reports MiB. A whole number of GiB is a binary-sized part (HBM: H100 81920 MiB), which its
        vendor calls that many GB (80 GB); anything else is a decimal size (GDDR: A10G 22888 MiB =
        24.0 GB), given in decimal GB to 0.1."""
        return gb_of(self.accelerator_memory_gib)

    @property
    def accelerator_memory_total_gib(self) -> float:
        return round(self.accelerator_memory_gib * self.accelerator_count, 2)

    @property
    def effective_accelerators(self) -> float:
        """Whole accelerators' worth of compute (a g6f.large is an eighth of an L4)."""
        return self.accelerator_count * self.accelerator_fraction

    @property
    def processes_per_node(self) -> int:
        """What torchrun's --nproc_per_node should be: one rank per GPU or per NeuronCore."""
        return self.neuron_cores if self.accelerator_kind == "neuron" and self.neuron_cores else self.accelerator_count

    @property
    def architecture(self) -> str:
        return self.architectures[0]

    def price(self, region: str) -> Optional[Price]:
        return self.prices.get(region)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["architectures"] = list(self.architectures)
        d["precisions"] = list(self.precisions)
        d["regions"] = list(self.regions)
        d["successors"] = list(self.successors)
        d["nvme"] = asdict(self.nvme) if self.nvme else None
        d["prices"] = {r: asdict(p) for r, p in sorted(self.prices.items())}
        d["capacity_block_prices"] = {r: asdict(p) for r, p in sorted(self.capacity_block_prices.items())}
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any], prices: Optional[Mapping[str, Price]] = None) -> "InstanceFacts":
        """`prices`: the type's prices by region, where they are not inline in `d` (the embedded
        catalog reads each region's from its own file: dl_selector/embedded.py)."""
        d = dict(d)
        d["architectures"] = tuple(d["architectures"])
        d["precisions"] = tuple(d["precisions"])
        d["regions"] = tuple(d["regions"])
        d["successors"] = tuple(d.get("successors", ()))
        d["nvme"] = NvmeDisks(**d["nvme"]) if d.get("nvme") else None
        d["prices"] = prices if prices is not None else {r: _price(p) for r, p in d.get("prices", {}).items()}
        d["capacity_block_prices"] = {r: CapacityBlockPrice(**p) for r, p in d.get("capacity_block_prices", {}).items()}
        return cls(**d)


def _price(p: dict[str, Any]) -> Price:
    """A Price from its JSON form (spot_quotes' lists back to tuples)."""
    if "spot_quotes" in p:
        p = {**p, "spot_quotes": tuple((str(az), float(v), str(ts)) for az, v, ts in p["spot_quotes"])}
    return Price(**p)
