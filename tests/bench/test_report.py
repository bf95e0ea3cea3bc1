"""bench report: ranking by measured samples per dollar (expected values worked out by hand from
the fixture's numbers), failures never ranked as zero, the model's misses flagged, the chart
opened and inspected."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from dl_selector.bench import chart
from dl_selector.bench import report as rep
from dl_selector.bench.contract import Plan, PlannedCandidate
from dl_selector.cli import main
from dl_selector.errors import UserError

# type: (model samples/s, on-demand $/h, spot $/h, measured samples/s or None)
FIXTURE = {
    "a.type": (1000.0, 2.0, 1.0, 1000.0),   # 1.8M/$ on-demand, 3.6M/$ spot
    "b.type": (2000.0, 3.0, 0.5, 1300.0),   # 1.56M/$ on-demand, 9.36M/$ spot; 0.65 of the model's relative speed
    "c.type": (500.0, 1.0, 0.8, 520.0),     # 1.872M/$ on-demand, 2.34M/$ spot
    "d.type": (4000.0, 0.2, 0.1, None),     # the cheapest by far, but it failed: never ranked
}


def _doc(rank_market: str = "on-demand", fixture: dict = FIXTURE) -> dict:
    cands = tuple(PlannedCandidate(instance_type=t, price_per_hour=sp or od, price_source="test", cost_usd=(sp or od) / 3,
                                   modelled_samples_per_second=model, uncertainty=0.2, basis="measured",
                                   accelerators="1 x GPU", on_demand_per_hour=od, spot_per_hour=sp,
                                   max_price_per_hour=od, worst_cost_usd=od / 3)
                  for t, (model, od, sp, _) in fixture.items())
    plan = Plan(name="t", profile="cost-efficient-training", region="us-east-1", market="spot", minutes=20,
                command="python3 -m dl_selector.bench.reference", candidates=cands, total_cost_usd=1.0,
                max_cost_usd=None, catalog_as_of="2026-11-22", created="2026-11-23T00:00Z", rank_market=rank_market)
    return {"version": 1, "collected": "2026-11-23T01:00Z", "source": "s3://b/bench/t/",
            "plan": json.loads(plan.to_json()),
            "measurements": [{"instance_type": t, "samples_per_second": m, "min": m * 0.99, "max": m * 1.01,
                              "windows": 5, "spread": 0.02, "labels": {}, "result": "s3://b/x"}
                             for t, (_, _, _, m) in fixture.items() if m],
            "failed": [{"instance_type": t, "reason": "never reported in: no spot capacity"}
                       for t, (_, _, _, m) in fixture.items() if not m]}


# 1e999 parses to inf (json.dumps would write Infinity, which the parser refuses before we see it).
HUGE = "__1e999__"


def _write(tmp_path: Path, doc: dict) -> Path:
    path = tmp_path / "results.json"
    path.write_text(json.dumps(doc).replace(f'"{HUGE}"', "1e999"))
    return path


def test_ranks_by_measured_samples_per_dollar_in_the_plans_market(tmp_path):
    r = rep.build_report(rep.load_results(_write(tmp_path, _doc("on-demand"))))
    assert [x.instance_type for x in r.ranked] == ["c.type", "a.type", "b.type"]  # 1.872M, 1.8M, 1.56M
    assert r.ranked[0].per_dollar("on-demand") == pytest.approx(520 * 3600 / 1.0)
    assert [x.instance_type for x in r.failed] == ["d.type"]
    r = rep.build_report(_doc("spot"))
    assert [x.instance_type for x in r.ranked] == ["b.type", "a.type", "c.type"]  # 9.36M, 3.6M, 2.34M
    assert r.winner.instance_type == "b.type"


def test_disagreement_is_relative_to_the_benchmarks_scale():
    r = rep.build_report(_doc())
    # ratios measured/model: a 1.0, b 0.65, c 1.04 -> median 1.0; b is 35% below the model's relative speed
    by = {x.instance_type: x for x in r.ranked}
    assert r.scale == pytest.approx(1.0)
    assert by["b.type"].relative == pytest.approx(0.65) and by["b.type"].disagrees
    assert not by["a.type"].disagrees and not by["c.type"].disagrees
    # The same shape in other units (a benchmark counting 3x the samples) flags the same type.
    tripled = {t: (m, od, sp, s * 3 if s else None) for t, (m, od, sp, s) in FIXTURE.items()}
    r3 = rep.build_report(_doc(fixture=tripled))
    assert r3.scale == pytest.approx(3.0)
    assert [x.instance_type for x in r3.ranked if x.disagrees] == ["b.type"]


@pytest.mark.parametrize("measured, flagged", [(1200.0, False), (1300.0, True), (740.0, True), (770.0, False)])
def test_the_threshold_is_25_percent(measured, flagged):
    fixture = {"a.type": (1000.0, 1.0, 0.5, 1000.0), "b.type": (1000.0, 1.0, 0.5, 1000.0),
               "c.type": (1000.0, 1.0, 0.5, measured)}
    r = rep.build_report(_doc(fixture=fixture))
    assert {x.instance_type: x.disagrees for x in r.ranked}["c.type"] is flagged


def test_one_measured_candidate_has_no_relative_flag():
    fixture = {"a.type": (1000.0, 1.0, 0.5, 3000.0), "b.type": (1000.0, 1.0, 0.5, None)}
    r = rep.build_report(_doc(fixture=fixture))
    assert r.ranked[0].relative is None and not r.ranked[0].disagrees
    assert "Fewer than two candidates were measured" in rep.markdown(r)


def test_table_and_markdown_say_what_a_reviewer_needs(tmp_path, capsys):
    path = _write(tmp_path, _doc())
    md = tmp_path / "report.md"
    assert main(["bench", "report", "--results", str(path), "--markdown", str(md)]) == 0
    out = capsys.readouterr().out
    assert "winner: c.type, 1,872,000 samples per dollar at on-demand prices (4.0% more than a.type)" in out
    header = out.splitlines()[0].split()
    for column in ("rank", "type", "accelerators", "measured", "model", "vs", "$/h", "samples/$", "note"):
        assert column in header
    c_line = next(line for line in out.splitlines() if line.startswith("1 ") and "c.type" in line)
    assert "520.0 ±1.0%" in c_line and "500 ±20%" in c_line and "1,872,000" in c_line and "1.000" in c_line
    assert "plan t: profile cost-efficient-training, us-east-1" in out and "collected 2026-11-23T01:00Z" in out
    d_line = next(line for line in out.splitlines() if line.startswith("-") and "d.type" in line)
    assert "FAILED" in d_line and "no spot capacity" in d_line
    assert "model overrates it by 35%" in out
    text = md.read_text()
    for heading in ("# Measured selection: cost-efficient-training in us-east-1", "## What was measured",
                    "## Ranking", "## Decision", "## Where the model was wrong", "## Not measured"):
        assert heading in text
    assert "**b.type**: measured 1,300.0 samples/s, 0.65x" in text and "too high" in text
    assert "| 1 | c.type |" in text
    assert "command: `python3 -m dl_selector.bench.reference`" in text and "at most 20 min" in text
    assert "- **d.type**: never reported in: no spot capacity" in text
    # The decision says whether the other market would change it: b.type, 9.36M/$ at spot prices.
    assert "At spot prices b.type would win instead (9,360,000 samples per dollar against 2,340,000)" in text
    assert "![" not in text


def test_markdown_links_the_chart():
    assert "![samples/s against $/hour](chart.png)" in rep.markdown(rep.build_report(_doc()), chart_path="chart.png")


def test_failed_candidates_are_listed_never_ranked_as_zero():
    r = rep.build_report(_doc())
    assert "d.type" not in [x.instance_type for x in r.ranked]  # the cheapest modelled, yet no figure: no rank
    (d,) = r.failed
    assert d.reason == "never reported in: no spot capacity" and d.per_dollar("on-demand") is None
    assert d.per_dollar("spot") is None and not d.disagrees


def test_a_measured_type_without_a_price_in_the_market_ranks_last():
    # e.type is the fastest per dollar on-demand (1000*3600/0.5 = 7.2M) but has no spot price on record.
    fixture = {**FIXTURE, "e.type": (1000.0, 0.5, None, 1000.0)}
    r = rep.build_report(_doc("spot", fixture=fixture))
    assert [x.instance_type for x in r.ranked] == ["b.type", "a.type", "c.type", "e.type"]
    assert r.ranked[-1].per_dollar("spot") is None
    assert rep.build_report(_doc("on-demand", fixture=fixture)).winner.instance_type == "e.type"
    line = next(x for x in rep.table_text(r).splitlines() if "e.type" in x)
    assert line.split()[0] == "4"


def test_samples_per_dollar_in_both_markets():
    (a,) = [x for x in rep.build_report(_doc()).ranked if x.instance_type == "a.type"]
    assert a.per_dollar("on-demand") == pytest.approx(1000 * 3600 / 2.0)  # 1.8M
    assert a.per_dollar("spot") == pytest.approx(1000 * 3600 / 1.0)  # 3.6M


def test_json_output(tmp_path, capsys):
    assert main(["bench", "report", "--results", str(_write(tmp_path, _doc())), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["winner"] == "c.type" and [f["instance_type"] for f in doc["failed"]] == ["d.type"]
    assert doc["failed"][0]["samples_per_dollar"] is None  # never a zero
    assert doc["failed"][0]["reason"] == "never reported in: no spot capacity" and doc["failed"][0]["rank"] is None
    b = next(x for x in doc["ranked"] if x["instance_type"] == "b.type")
    assert b["rank"] == 3 and b["disagrees"] is True and b["vs_model"] == pytest.approx(0.65)
    assert b["spot_samples_per_dollar"] == pytest.approx(9_360_000) and b["on_demand_samples_per_dollar"] == 1_560_000
    assert b["measured_min"] == pytest.approx(1287) and b["measured_max"] == pytest.approx(1313)


def test_chart_is_a_real_png_with_one_point_per_candidate(tmp_path):
    from PIL import Image

    r = rep.build_report(_doc())
    fig = chart.chart_figure(r)
    ax = fig.axes[0]
    assert ax.get_xscale() == "log" and ax.get_yscale() == "log"
    assert ax.get_xlabel() == "$ per hour (on-demand / spot)"
    assert ax.get_ylabel() == "samples per second (measured / modelled)"
    gids = [c.get_gid() for c in ax.collections if c.get_gid()]
    assert sorted(g.split(":")[1] for g in gids if g.startswith("model:")) == sorted(FIXTURE)
    for market in ("on-demand", "spot"):
        assert sorted(g.split(":")[1] for g in gids if g.startswith(f"measured-{market}:")) == [
            "a.type", "b.type", "c.type"]
    assert any("winner: c.type" in t.get_text() for t in ax.texts)
    assert any(t.get_text().endswith("/$") for t in ax.texts)  # the equal-samples-per-dollar lines are labelled

    assert any(t.get_text().startswith("d.type") and "failed" in t.get_text() for t in ax.texts)

    png = tmp_path / "chart.png"
    fig = chart.write_chart(r, str(png))
    width, height = (round(v * fig.dpi) for v in fig.get_size_inches())
    assert (width, height) == (round(chart.FIGSIZE[0] * chart.DPI), round(chart.FIGSIZE[1] * chart.DPI))
    with Image.open(png) as im:
        assert im.format == "PNG" and im.size == (width, height)
        colours = im.convert("RGB").getcolors(maxcolors=1 << 20)
    assert len(colours) > 50  # drawn on, not a blank canvas
    chart.write_chart(r, str(tmp_path / "again.png"))
    assert (tmp_path / "again.png").read_bytes() == png.read_bytes()  # same input, same bytes


def test_chart_labels_do_not_overlap_each_other():
    fig = chart.chart_figure(rep.build_report(_doc()))
    renderer = fig.canvas.get_renderer()
    boxes = [t.get_window_extent(renderer) for t in fig.axes[0].texts]
    assert not [(i, j) for i, a in enumerate(boxes) for j, b in enumerate(boxes[:i]) if a.overlaps(b)]


@pytest.mark.parametrize("fixture", [
    {"a.type": (1000.0, 2.0, 1.0, 1000.0)},  # one candidate: no relative comparison, still a chart
    {"a.type": (1000.0, 2.0, 1.0, None), "b.type": (500.0, 1.0, None, None)},  # nothing measured
])
def test_chart_and_text_survive_few_results(tmp_path, fixture):
    r = rep.build_report(rep.load_results(_write(tmp_path, _doc(fixture=fixture))))
    chart.write_chart(r, str(tmp_path / "few.png"))
    assert rep.table_text(r) and rep.markdown(r)
    if not r.ranked:
        assert "no candidate was measured" in rep.table_text(r)


def test_the_chart_without_matplotlib_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    with pytest.raises(UserError, match=r"pip install 'dl-launcher\[bench\]'"):
        chart.chart_figure(rep.build_report(_doc()))


def _set(d: dict, path: str, value) -> None:
    *keys, last = path.split(".")
    for k in keys:
        d = d[int(k)] if isinstance(d, list) else d[k]
    d[int(last) if isinstance(d, list) else last] = value


@pytest.mark.parametrize("mutate, words", [
    (lambda d: d.update(version=3), "version must be 1"),
    (lambda d: d["measurements"][0].update(instance_type="zz.type"), "is not in the plan"),
    (lambda d: d["measurements"][0].update(samples_per_second=0), r"measurements\[1\].samples_per_second must be above zero"),
    (lambda d: d["failed"].clear(), "d.type is in the plan but neither in measurements nor in failed"),
    (lambda d: d["failed"].append(dict(d["failed"][0])), "listed twice"),
    (lambda d: d.pop("measurements"), "measurements must be a list"),
    (lambda d: d["plan"].pop("candidates"), "plan: missing key"),
    (lambda d: _set(d, "measurements.0.min", HUGE), r"measurements\[1\].min = inf is not a finite number"),
    (lambda d: _set(d, "measurements.0.max", "1010"), r"measurements\[1\].max must be a number, got the string"),
    (lambda d: _set(d, "measurements.0.min", 5000), r"measurements\[1\].samples_per_second 1000 is outside min"),
    (lambda d: _set(d, "measurements.0.windows", 2.5), r"measurements\[1\].windows = 2.5 is not a whole number"),
    (lambda d: _set(d, "measurements.0.spread", -1), r"measurements\[1\].spread must be at least 0"),
    (lambda d: _set(d, "measurements.0.instance_type", ["a.type"]), r"measurements\[1\].instance_type .* not in"),
    (lambda d: _set(d, "failed.0.reason", None), r"failed\[1\].reason must be a string"),
    (lambda d: _set(d, "plan.candidates.0.on_demand_per_hour", HUGE),
     r"plan.candidates\[1\].on_demand_per_hour = inf is not a finite number"),
    (lambda d: _set(d, "plan.candidates.1.spot_per_hour", 0), r"plan.candidates\[2\].spot_per_hour must be above zero"),
    (lambda d: _set(d, "plan.candidates.0.modelled_samples_per_second", None),
     r"plan.candidates\[1\].modelled_samples_per_second must be at least 0, got None"),
    (lambda d: _set(d, "plan.rank_market", "capacity-block"), "plan: rank_market 'capacity-block'"),
    (lambda d: _set(d, "collected", 5), "collected must be a string"),
])
def test_a_malformed_file_is_one_line_naming_the_key(tmp_path, mutate, words):
    doc = _doc()
    mutate(doc)
    with pytest.raises(UserError, match=words) as e:
        rep.load_results(_write(tmp_path, doc))
    assert "\n" not in str(e.value) and "results.json" in str(e.value)


@pytest.mark.parametrize("content, words", [
    ("{not json", "not valid JSON"),
    ('{"version": 1, "min": NaN}', r"not valid JSON \(NaN is not allowed"),
    ("[1, 2]", "expected a JSON object"),
    ("", "is empty"),
])
def test_a_file_that_is_not_a_results_document(tmp_path, content, words):
    path = tmp_path / "results.json"
    path.write_text(content)
    with pytest.raises(UserError, match=words) as e:
        rep.load_results(str(path))
    assert "\n" not in str(e.value) and "results.json" in str(e.value)


def test_a_missing_file(tmp_path):
    with pytest.raises(UserError, match="cannot read bench results file .*none.json"):
        rep.load_results(str(tmp_path / "none.json"))


def test_cli_refuses_a_missing_file_in_one_line(tmp_path, capsys):
    assert main(["bench", "report", "--results", str(tmp_path / "none.json")]) == 2
    err = capsys.readouterr().err
    assert "cannot read bench results file" in err and len(err.strip().splitlines()) == 1


def test_a_winner_closer_than_the_windows_moved_is_called_a_tie():
    # 1,000 vs 1,010 samples/s at one price: 1% apart, while each figure's windows spread 2%.
    fixture = {"a.type": (1000.0, 1.0, 0.5, 1000.0), "b.type": (1000.0, 1.0, 0.5, 1010.0)}
    r = rep.build_report(_doc(fixture=fixture))
    assert "winner: b.type" in rep.table_text(r) and "within the windows' spread, a tie" in rep.table_text(r)
    assert "a tie" not in rep.table_text(rep.build_report(_doc()))  # c.type leads a.type by 4% > 2%


def test_results_not_collected_from_a_bench_run_are_titled_an_illustration():
    """Issue 28: the docs' sample chart was titled "measured" while its figures were made up."""
    measured = rep.build_report(_doc())
    assert rep.markdown(measured).startswith("# Measured selection: cost-efficient-training")
    sample = rep.build_report({**_doc(), "source": "illustration: made-up figures, not a measurement"})
    assert rep.markdown(sample).startswith("# Illustration (not measured): cost-efficient-training")
    docs = json.loads((Path(__file__).resolve().parents[2] / "docs" / "sample-results.json").read_text())
    assert not rep.is_measurement(rep.build_report(docs))
