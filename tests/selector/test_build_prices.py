"""load_prices on the optional spot columns (spread, AZ count, own date and source): what it
refuses, in one line naming the file, the line and what is allowed; older four-column files load."""
from __future__ import annotations

import pytest

from selector.errors import UserError
from selector.prices import load_prices


# ---- load_prices: the optional spot columns ----------------------------------------------------

HEADER = "instance_type,region,on_demand_usd_per_hour,spot_usd_per_hour,spot_min,spot_max,spot_azs\n"


@pytest.mark.parametrize("row, expected", [
    ("g6.xlarge,us-east-1,0.8048,0.38,0.40,0.45,3", "line 2: spot_min 0.4 is above spot_usd_per_hour 0.38"),
    ("g6.xlarge,us-east-1,0.8048,0.38,0.30,0.35,3", "line 2: spot_max 0.35 is below spot_usd_per_hour 0.38"),
    ("g6.xlarge,us-east-1,0.8048,0.38,0.30,0.45,2.5", "line 2: spot_azs = 2.5"),
    ("g6.xlarge,us-east-1,0.8048,0.38,0.30,0.45,-1", "line 2: spot_azs must be at least 0 and at most 1000 (a whole number), got -1"),
    ("g6.xlarge,us-east-1,0.8048,0.38,0.30,0.45,three", "line 2: spot_azs = 'three' is not a number"),
    ("g6.xlarge,us-east-1,0.8048,,0.30,0.45,3", "line 2: spot_min, spot_max, spot_azs given without spot_usd_per_hour"),
    ("g6.xlarge,us-east-1,0.8048,,,,2", "line 2: spot_azs given without spot_usd_per_hour"),
])
def test_bad_spot_spread_is_one_line_naming_file_line_and_what_is_allowed(tmp_path, row, expected):
    f = tmp_path / "mine.csv"
    f.write_text(HEADER + row + "\n")
    with pytest.raises(UserError) as e:
        load_prices(str(f))
    msg = str(e.value)
    assert msg.startswith("price file ") and "mine.csv" in msg and expected in msg and "\n" not in msg


def test_bad_spot_spread_through_the_cli_is_exit_2(capsys, tmp_path):
    from selector.cli import main
    f = tmp_path / "mine.csv"
    f.write_text(HEADER + "g6.xlarge,us-east-1,0.8048,0.38,0.40,0.45,3\n")
    assert main(["recommend", "--profile", "dev-prototyping", "--prices", str(f)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: price file ") and "spot_min" in err and err.count("\n") == 1


def test_a_users_four_column_file_still_loads(tmp_path):
    f = tmp_path / "mine.csv"
    f.write_text("instance_type,region,on_demand_usd_per_hour,spot_usd_per_hour\ng6.xlarge,us-east-1,0.70,0.30\n")
    p = load_prices(str(f))["g6.xlarge"]["us-east-1"]
    assert (p.on_demand, p.spot, p.spot_min, p.spot_max, p.spot_azs, p.spot_as_of, p.spot_source) == \
        (0.70, 0.30, None, None, 0, "", "")
    assert p.as_of == "unknown" and p.spot_date == "unknown"
