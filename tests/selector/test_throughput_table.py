"""The throughput table's honesty: every relative_training_throughput names its basis and
uncertainty by the rule in dl_selector/data/accelerators.md, every measured or claimed figure is
recomputed here from the numbers its source column quotes, and the model picks the A100 80 GB
row for p4de (same EC2 name "A100" as p4d) and says how far its figure may be off."""
from __future__ import annotations

import csv
import math
import re
import shutil
import statistics
from pathlib import Path
from dl_selector.record import replace

import pytest

from dl_selector.accelerators import BASES, DEFAULT_UNCERTAINTY, load_accelerators, spec_for
from dl_selector.catalog import load_catalog
from dl_selector.errors import UserError
from dl_selector.paths import data_file
from dl_selector.profiles import get_profile
from dl_selector.requirements import Context, accelerator_speed
from dl_selector.throughput import Estimate, model

# Rows whose uncertainty differs from their basis's default; accelerators.md gives each a reason
# and marks it "(override)".
OVERRIDES = {"T4": 0.25, "T4g": 0.25, "K80": 0.25, "L4": 0.40, "B200": 0.61, "B300": 0.61}


def _rows() -> dict[str, dict[str, str]]:
    with open(data_file("accelerators.csv"), newline="") as f:
        return {r["name"]: r for r in csv.DictReader(f)}


ROWS = _rows()
ACC = load_accelerators()
MD = open(data_file("accelerators.md")).read()


def _provenance(name: str) -> str:
    """The row's bullet under "Per-row provenance" in accelerators.md."""
    section = MD.split("## Per-row provenance", 1)[1]
    for bullet in re.split(r"\n(?=\* \*\*)", section):
        if re.match(rf"\* \*\*{re.escape(name)}(\*\*| /)", bullet) or f"/ {name}**" in bullet.split("\n", 1)[0]:
            return bullet
    raise AssertionError(f"no provenance bullet for {name}")


def _half_unit(written: str) -> float:
    """Half a unit in the last digit the table writes: '2.2' -> 0.05, '0.054' -> 0.0005."""
    decimals = len(written.split(".", 1)[1]) if "." in written else 0
    return 0.5 * 10 ** -decimals


def _agrees(name: str, computed: float) -> None:
    written = ROWS[name]["relative_training_throughput"]
    assert abs(computed - float(written)) <= _half_unit(written) + 1e-9, (name, computed, written)


def _quoted(name: str, *figures: str) -> None:
    for fig in figures:
        assert fig in ROWS[name]["source"], f"{name}: source does not quote {fig!r}"


def _geomean(num: str, den: str) -> float:
    a = [float(x) for x in num.split("/")]
    b = [float(x) for x in den.split("/")]
    assert len(a) == len(b)
    return math.exp(sum(math.log(x / y) for x, y in zip(a, b)) / len(a))


# ---------------------------------------------------------------- basis and uncertainty rule

def test_every_row_has_a_basis_and_an_uncertainty_by_the_rule():
    assert set(ROWS) == set(ACC)
    for name, spec in ACC.items():
        assert spec.basis in BASES, name
        if spec.basis in ("baseline", "not-for-training"):
            assert spec.uncertainty == 0.0, name
        else:
            assert 0.0 < spec.uncertainty < 1.0, name
        expected = OVERRIDES.get(name, DEFAULT_UNCERTAINTY[spec.basis])
        assert spec.uncertainty == expected, f"{name}: {spec.uncertainty} is not the rule's {expected}"
        if spec.basis in ("vendor-claim", "vendor-upper-bound"):
            assert spec.uncertainty >= 0.30, name
        assert spec.evidence, f"{name}: no evidence words for the explanation"


def test_the_rule_and_every_basis_are_defined_in_the_notes():
    for basis, default in DEFAULT_UNCERTAINTY.items():
        row = next(line for line in MD.splitlines() if line.startswith(f"| `{basis}` |"))
        assert (f"±{default:.0%}" in row) if default else row.rstrip().endswith("| 0 |"), basis


def test_each_override_is_explained():
    for name in OVERRIDES:
        assert "(override)" in _provenance(name), name
        assert ACC[name].uncertainty != DEFAULT_UNCERTAINTY[ACC[name].basis], name


def test_the_baseline_is_the_v100_alone_and_zero_means_not_for_training():
    assert [n for n, a in ACC.items() if a.basis == "baseline"] == ["V100"]
    assert ACC["V100"].relative_training_throughput == 1.0
    for name, spec in ACC.items():
        assert (spec.basis == "not-for-training") == (spec.relative_training_throughput == 0), name
        if spec.basis == "not-for-training":
            assert "training" not in spec.roles, name


# ---------------------------------------------------------------- derived rows state their anchor

DERIVED = re.compile(r"derived-tflops(?: \(FP32\))?: anchored on (.+?) ([\d.]+) x \(([\d.]+)/([\d.]+)\)\^0\.78")


def test_derived_rows_state_their_anchor_and_reproduce():
    derived = [n for n, a in ACC.items() if a.basis == "derived-tflops"]
    assert set(derived) == {"L4", "RTX PRO Server 6000", "M60", "Radeon Pro V520", "RTX PRO 4500"}
    for name in derived:
        m = DERIVED.search(ROWS[name]["source"])
        assert m, f"{name}: source does not write out 'derived-tflops: anchored on X rel x (tf/tf0)^0.78'"
        anchor, rel, tf, tf0 = m.group(1), float(m.group(2)), float(m.group(3)), float(m.group(4))
        mine = ACC[name]
        assert tf in (mine.dense_fp16_tflops, mine.dense_fp32_tflops), name
        assert anchor.split()[0] in mine.evidence or anchor in mine.evidence, f"{name}: evidence does not name {anchor}"
        if anchor in ACC:  # anchored on a row: use that row's figures, not a copy that could drift
            assert rel == ACC[anchor].relative_training_throughput, name
            assert tf0 in (ACC[anchor].dense_fp16_tflops, ACC[anchor].dense_fp32_tflops), name
            assert ACC[anchor].basis != "derived-tflops", f"{name}: anchored on another derived row"
        else:  # anchored on a measured card the table does not list (RTX 6000 Ada, the L40S proxy)
            assert anchor == "RTX 6000 Ada" and rel == 1.70 and tf0 == 364
            _quoted("L40S", "RTX 6000 Ada 341/255/79/160184/1146/36745/16049")
        _agrees(name, rel * (tf / tf0) ** 0.78)


# ---------------------------------------------------------------- measured ratios, recomputed

V100_7 = "229/189/57/79111/833/18493/6071"  # LambdaCloud V100 16GB, seven models
H100_5 = "859/858/311/473757/2791"  # LambdaCloud 1x H100 80GB SXM5, five models (v2 files)
LAMBDA_7 = {
    "A100": "422/416/133/212958/1455/38957/17558",
    "A100 80GB": "458/443/152/243500/1582/43078/17918",
    "H100": "782/812/301/467071/2616/62259/30841",
}


@pytest.mark.parametrize("name", sorted(LAMBDA_7))
def test_lambda_measured_rows_reproduce_from_the_quoted_figures(name):
    _quoted(name, LAMBDA_7[name], V100_7)
    assert ACC[name].basis == "measured"
    _agrees(name, _geomean(LAMBDA_7[name], V100_7))


def test_l40s_proxy_reproduces_from_rtx_6000_ada():
    ada = "341/255/79/160184/1146/36745/16049"
    _quoted("L40S", ada, V100_7)
    _agrees("L40S", _geomean(ada, V100_7))


def test_a100_80gb_measures_about_ten_percent_above_40gb():
    ratio = _geomean(LAMBDA_7["A100 80GB"], LAMBDA_7["A100"])
    assert 1.05 < ratio < 1.15
    assert ACC["A100 80GB"].relative_training_throughput > ACC["A100"].relative_training_throughput


def test_h200_chains_a_measured_ratio_through_h100():
    h200 = "946/932/350/570504/3079"
    _quoted("H200", h200, H100_5, "H100 4.2 = 4.7")
    # a chain multiplies the anchor row's figure as the table writes it (accelerators.md)
    _agrees("H200", _geomean(h200, H100_5) * ACC["H100"].relative_training_throughput)


def test_b200_and_b300_rest_on_bf16_measurements_not_fp8_mlperf():
    """Issue 25: 8.8 came from MLPerf ratios run in FP8; the row is BF16. Issue 39: the centre is
    the median of the three Megatron-Bridge releases of one row (not the most favourable alone),
    the band holds their spread, and Lambda's suite agrees with the centre."""
    b200 = "1025/1405/523/852308/3076"
    _quoted("B200", b200, H100_5, "1.45x", "B200 13568 vs H100 5824", "2.33x", "B200 8213 vs H100 5630",
            "B200 8047 vs H100 5993", "FP8", "median")
    lam = _geomean(b200, H100_5)
    releases = [8213 / 5630, 8047 / 5993, 13568 / 5824]  # containers 25.11, 26.02, 26.04.01
    assert [round(r, 2) for r in releases] == [1.46, 1.34, 2.33] and round(lam, 2) == 1.45
    h100 = ACC["H100"].relative_training_throughput
    _agrees("B200", statistics.median(releases) * h100)
    spec = ACC["B200"]
    assert abs(lam * h100 - spec.relative_training_throughput) < 0.05  # Lambda's suite agrees with the median
    for measured in (lam * h100, *(r * h100 for r in releases)):  # the band holds every release and Lambda
        assert spec.relative_training_throughput * (1 - spec.uncertainty) <= measured <= \
            spec.relative_training_throughput * (1 + spec.uncertainty), measured
    assert "MLPerf" not in spec.evidence and spec.basis == "proxy-measured"
    _quoted("B300", "B300 15232 vs B200 13568", "1.12x")
    _agrees("B300", 15232 / 13568 * spec.relative_training_throughput)
    assert ACC["B300"].uncertainty == spec.uncertainty  # the chain inherits B200's band


def test_t4_rests_on_a_measured_training_ratio_not_a_vendor_claim():
    _quoted("T4", "Tesla T4 15994", "Tesla V100S-PCIE 43447", "T4 1198", "V100 16GB 3382")
    _agrees("T4", 15994 / 43447)
    assert round(1198 / 3382, 2) == 0.35  # the inference cross-check the source quotes
    assert "3.3x" not in ROWS["T4"]["source"] and "vendor-claim" not in ROWS["T4"]["source"]
    assert ACC["T4g"].relative_training_throughput == ACC["T4"].relative_training_throughput
    assert "L4" in _provenance("L4") and "No measured L4 training throughput was found" in _provenance("L4")


def test_single_model_proxies_reproduce():
    _quoted("A10G", "3935 s", "5414 s")
    _agrees("A10G", 3935 / 5414)
    _quoted("K80", "51.5 img/s", "1200 img/s", "833 img/s")
    _agrees("K80", math.sqrt(51.5 / 1200 * 51.5 / 833))


# ---------------------------------------------------------------- vendor claims, recomputed

def test_gaudi_from_habanas_cost_to_train_claim():
    _quoted("Gaudi HL-205", "69% lower cost-to-train", "$13.10904", "$31.212")
    _agrees("Gaudi HL-205", 1 / (1 - 0.69) * 13.10904 / 31.212)


def test_trainium_from_aws_cost_to_train_claim_and_below_the_tflops_figure():
    _quoted("Trainium", "up to 50%", "$21.50", "$32.7726", "A100 2.2")
    claim = 2 * 8 * ACC["A100"].relative_training_throughput * 21.50 / 32.7726 / 16
    _agrees("Trainium", claim)
    tflops = ACC["A100"].relative_training_throughput * (190 / 312) ** 0.78
    assert tflops > claim  # why the claim is kept (accelerators.md, "vendor-claim and TFLOPS")


def test_trainium_rows_from_best_case_claims_are_upper_bounds():
    for name in ("Trainium", "Trainium2"):
        assert ACC[name].basis == "vendor-upper-bound", name
        assert "upper bound" in _provenance(name), name


def test_an_upper_bound_is_the_top_of_its_band_never_below_the_centre():
    """Issue 39: the table writes the vendor's best case; the model ranks on a centre below it whose
    band tops out exactly at the bound (Trainium 1.44 -> 1.11, Trainium2 1.86 -> 1.43)."""
    bounds = {n: s for n, s in ACC.items() if s.basis == "vendor-upper-bound"}
    assert set(bounds) == {"Trainium", "Trainium2"}
    for name, spec in bounds.items():
        written = float(ROWS[name]["relative_training_throughput"])
        assert spec.upper_bound == written, name
        assert spec.relative_training_throughput < written, name
        assert math.isclose(spec.relative_training_throughput * (1 + spec.uncertainty), written), name
    assert round(ACC["Trainium"].relative_training_throughput, 2) == 1.11
    assert round(ACC["Trainium2"].relative_training_throughput, 2) == 1.43
    for name, spec in ACC.items():
        if spec.basis != "vendor-upper-bound":
            assert spec.upper_bound is None
            assert spec.relative_training_throughput == float(ROWS[name]["relative_training_throughput"]), name


def test_trainium2_from_aws_price_performance_claim_at_capacity_block_rates():
    """The claim at the catalog's own rates for trn2 and p5en (one quote, one date): the only Capacity
    Block rates in the repo (test_capacity_block_rates)."""
    _quoted("Trainium2", "30-40% better price performance", "$35.7608", "$63.158", "H200 4.7")
    ohio = {n: load_catalog().get(n).capacity_block_prices["us-east-2"] for n in ("trn2.48xlarge", "p5en.48xlarge")}
    assert ohio["trn2.48xlarge"].as_of == ohio["p5en.48xlarge"].as_of == "2026-10-08"
    trn2, p5en = ohio["trn2.48xlarge"].usd_per_hour, ohio["p5en.48xlarge"].usd_per_hour
    h200 = ACC["H200"].relative_training_throughput
    per_chip = [k * 8 * h200 * trn2 / p5en / 16 for k in (1.3, 1.4)]
    lo, hi = min(per_chip), max(per_chip)
    assert (round(lo, 2), round(hi, 2)) == (1.73, 1.86)
    _agrees("Trainium2", hi)  # the best case (40% better) is the upper bound
    tflops = ACC["H100"].relative_training_throughput * (667 / 989) ** 0.78
    assert round(tflops, 1) == 3.1 and 1.655 < tflops / hi and tflops / lo < 1.795  # "66-79% above"


# ---------------------------------------------------------------- memory variants

def test_p4de_gets_the_80gb_row_and_p4d_the_base_row():
    catalog = load_catalog()
    p4d, p4de = catalog.get("p4d.24xlarge"), catalog.get("p4de.24xlarge")
    assert p4d.accelerator == p4de.accelerator == "A100"  # the EC2 name, which other code keys on
    assert spec_for(p4de, ACC).name == "A100 80GB"
    assert spec_for(p4d, ACC).name == "A100"
    assert spec_for(("A100", 80.0), ACC).name == "A100 80GB"
    assert spec_for("A100", ACC).name == "A100"
    assert spec_for(("A100", 40.0), ACC).name == "A100"
    training = get_profile("multi-gpu-training")
    assert "8 x A100 80GB at 2.40x V100" in model(p4de, training, ACC).explanation
    assert "8 x A100 at 2.20x V100" in model(p4d, training, ACC).explanation
    assert model(p4de, training, ACC).samples_per_second > model(p4d, training, ACC).samples_per_second


def test_every_catalog_type_resolves_and_only_p4de_takes_a_variant():
    catalog = load_catalog()
    variants = {f.instance_type for f in catalog if spec_for(f, ACC).name != f.accelerator}
    assert variants == {"p4de.24xlarge"}
    g6f = next(f for f in catalog if f.family == "g6f")  # fractional L4: less memory, still the L4 row
    assert spec_for(g6f, ACC).name == "L4"
    with pytest.raises(KeyError):
        spec_for("no such accelerator", ACC)


def test_the_speed_requirement_reads_the_variant_too():
    p4de = load_catalog().get("p4de.24xlarge")
    ctx = Context("us-east-1", False, frozenset(), ACC)
    strict = replace(get_profile("multi-gpu-training"), min_relative_throughput=2.3)
    assert accelerator_speed(p4de, strict, ctx) is None  # 2.4 >= 2.3
    p4d = load_catalog().get("p4d.24xlarge")
    assert "2.20x a V100 < 2.3x" in accelerator_speed(p4d, strict, ctx)


# ---------------------------------------------------------------- the estimate says how sure it is

def test_a_modelled_estimate_carries_basis_and_uncertainty_in_the_explanation():
    p5 = load_catalog().get("p5.48xlarge")
    est = model(p5, get_profile("multi-gpu-training"), ACC)
    assert (est.source, est.basis, est.uncertainty) == ("model", "measured", 0.15)
    assert est.explanation.endswith("; model ±15% (measured: Lambda PyTorch suite, H100 SXM5)")
    assert "8 x H100 at 4.20x V100 x 0.95" in est.explanation
    trn2 = load_catalog().get("trn2.48xlarge")
    est = model(trn2, get_profile("multi-gpu-training"), ACC)
    assert (est.basis, est.uncertainty) == ("vendor-upper-bound", 0.30) and "model ±30% (vendor-upper-bound:" in est.explanation
    p3 = load_catalog().get("p3.2xlarge")
    assert "reference accelerator" in model(p3, get_profile("single-gpu-training"), ACC).explanation


def test_a_measured_estimate_keeps_its_positional_form_and_has_no_model_uncertainty():
    est = Estimate(123.0, "measured", "measured: 123 samples/s (t.csv)")
    assert (est.samples_per_second, est.source, est.explanation) == (123.0, "measured", "measured: 123 samples/s (t.csv)")
    assert est.uncertainty == 0.0 and est.basis == "user-measured"


# ---------------------------------------------------------------- the loader refuses a bad table

@pytest.mark.parametrize("old,new,message", [
    (',measured,0.15,"Lambda PyTorch suite, H100 SXM5"', ',measurd,0.15,"Lambda PyTorch suite, H100 SXM5"',
     "'H100' has basis='measurd'; allowed: baseline"),
    (',measured,0.15,"Lambda PyTorch suite, H100 SXM5"', ',measured,1.5,"Lambda PyTorch suite, H100 SXM5"',
     "'H100' has uncertainty='1.5'; expected a fraction"),
    ("A100 80GB SXM4\",A100,80,", "A100 80GB SXM4\",A1000,80,", "'A100 80GB' is a variant of 'A1000', which has no base row"),
    ("A100 80GB SXM4\",A100,80,", "A100 80GB SXM4\",A100,,", "needs both ec2_name and memory_gib"),
])
def test_a_bad_basis_uncertainty_or_variant_stops_the_table(tmp_path, old, new, message):
    path = tmp_path / "accelerators.csv"
    shutil.copy(data_file("accelerators.csv"), path)
    text = path.read_text()
    assert old in text, old
    path.write_text(text.replace(old, new, 1))
    with pytest.raises(UserError, match=re.escape(message)) as e:
        load_accelerators(str(path))
    assert "\n" not in str(e.value)


# ---------------------------------------------------------------- the docs' table of rows

def _docs_rows() -> list[str]:
    out = []
    for name, s in ACC.items():
        c = s.relative_training_throughput
        band = "-" if not s.uncertainty else f"{c*(1-s.uncertainty):.2f}-{c*(1+s.uncertainty):.2f} (±{s.uncertainty:.0%})"
        basis = s.basis + (f" (bound {s.upper_bound:g} = top of band)" if s.upper_bound is not None else "")
        out.append(f"| {name} | {c:.3g} | {band} | {basis} | {s.evidence} |")
    return out


def test_the_docs_show_each_rows_figure_band_and_basis():
    """Issue 39: docs/selector.md's table is the accelerator table as the model ranks on it."""
    docs = (Path(__file__).resolve().parents[2] / "docs" / "selector.md").read_text().splitlines()
    for row in _docs_rows():
        assert row in docs, f"docs/selector.md lacks or differs on: {row}"
