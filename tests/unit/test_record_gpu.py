"""The record's ``gpu`` section (shepherd/record/gpuquery.py) against the fake nvidia-smi.

The fake (tests/fixtures/fake-nvidia-smi) answers ``--query-gpu`` by cutting
the asked fields out of a ``--format=csv`` file (tests/fixtures/nvidia-smi/
query-gpu-*.csv, synthesised to the driver's format: see the fixtures'
README), refusing fields that file's driver does not know, as nvidia-smi does.
The topology rows are read from the real ``topo -m`` recordings under
tests/fixtures/gpu/.
"""

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from shepherd.record import gpuquery
from shepherd.record.gpuquery import (
    DYNAMIC_FIELDS,
    REASONS,
    STATIC_FIELDS,
    cuda_argv,
    cuda_version,
    dynamic_argv,
    invalid_field,
    parse_cuda_version,
    parse_dynamic,
    parse_query,
    query,
    query_argv,
    retry_fields,
    section,
    topo_rows,
    unavailable,
)

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
SMI = FIXTURES / "nvidia-smi"
GPU = FIXTURES / "gpu"
H100 = SMI / "query-gpu-h100-2.csv"
H100_HOT = SMI / "query-gpu-h100-2-hot.csv"
OLD = SMI / "query-gpu-gtx1080ti-old-driver.csv"
UUID0 = "GPU-6f1c2a7e-3b94-4d0e-9a51-0c8e2d7b4f13"
UUID1 = "GPU-b25d9e40-7c1f-4a68-8e3d-5f0a91c6e2b7"


@pytest.fixture
def smi(tmp_path):
    """The fake nvidia-smi, executable, as ``nvidia-smi`` in a temporary directory."""
    d = tmp_path / "bin"
    d.mkdir()
    shutil.copy(FIXTURES / "fake-nvidia-smi", d / "nvidia-smi")
    os.chmod(d / "nvidia-smi", 0o755)
    return str(d / "nvidia-smi")


def runner(calls=None, **env):
    """A ``run(argv) -> (status, output)`` as the shepherd provides one, with the fake's variables set."""
    full = {k: v for k, v in os.environ.items() if not k.startswith("FAKE_NVIDIA_SMI")}
    full.update({k: str(v) for k, v in env.items()})

    def run(argv):
        if calls is not None:
            calls.append(argv)
        try:
            p = subprocess.run(argv, capture_output=True, text=True, env=full, timeout=60, stdin=subprocess.DEVNULL)
        except OSError as exc:
            return -1, f"cannot run {argv[0]}: {exc.strerror}"
        return p.returncode, p.stdout + p.stderr
    return run


def values(row):
    return {k: f["value"] for k, f in row.items()}


# --- argv ------------------------------------------------------------------


def test_query_argv_is_one_call_for_every_static_field():
    argv = query_argv("/usr/bin/nvidia-smi", ["0", "3"])
    assert argv[0] == "/usr/bin/nvidia-smi"
    assert argv[1] == "--query-gpu=" + ",".join(STATIC_FIELDS)
    assert argv[2:] == ["--format=csv,noheader,nounits", "-i", "0,3"]
    fields = argv[1].split("=", 1)[1].split(",")
    for needed in ("uuid", "name", "pci.bus_id", "driver_version", "vbios_version", "persistence_mode",
                   "ecc.mode.current", "mig.mode.current", "compute_mode", "clocks.applications.graphics",
                   "clocks.applications.memory", "clocks.max.sm", "clocks.max.memory", "power.limit",
                   "temperature.gpu", "clocks_event_reasons.hw_thermal_slowdown", "clocks_event_reasons.active"):
        assert needed in fields
    # Current names only: the old ones are the retry's.
    assert not any(f.startswith("clocks_throttle_reasons.") for f in fields)


def test_dynamic_and_cuda_argv():
    assert dynamic_argv("nvidia-smi", ["GPU-x"]) == [
        "nvidia-smi", "--query-gpu=" + ",".join(DYNAMIC_FIELDS), "--format=csv,noheader,nounits", "-i", "GPU-x"]
    assert DYNAMIC_FIELDS[:2] == ("uuid", "temperature.gpu")
    assert cuda_argv("nvidia-smi", ["0", "1"]) == ["nvidia-smi", "-q", "-i", "0,1", "-d", "COMPUTE"]


# --- the fake nvidia-smi, run with our argv ----------------------------------


def test_static_query_through_the_fake(smi):
    rc, out = runner(FAKE_NVIDIA_SMI_QUERY_GPU=H100)(query_argv(smi, ["0", "1"]))
    assert rc == 0, out
    rows = parse_query(out)
    assert [r["uuid"]["value"] for r in rows] == [UUID0, UUID1]
    row = values(rows[0])
    assert row["index"] == 0
    assert row["name"] == "NVIDIA H100 80GB HBM3"
    assert row["pci.bus_id"] == "00000000:18:00.0"
    assert row["driver_version"] == "550.127.05"
    assert row["vbios_version"] == "96.00.99.00.01"
    assert (row["persistence_mode"], row["ecc.mode.current"], row["mig.mode.current"]) == ("Enabled", "Enabled",
                                                                                         "Disabled")
    assert row["compute_mode"] == "Default"
    assert (row["clocks.applications.graphics"], row["clocks.max.memory"]) == (1980, 2619)
    assert row["power.limit"] == 700.0
    assert row["temperature.gpu"] == 33
    assert row["clocks_event_reasons.active"] == "0x0000000000000001"
    assert row["clocks_event_reasons.gpu_idle"] is True
    assert row["clocks_event_reasons.hw_thermal_slowdown"] is False
    assert rows[0]["power.limit"]["source"] == "nvidia-smi --query-gpu=power.limit"
    assert all("error" not in f for f in rows[0].values())


def test_the_fake_selects_gpus_by_uuid(smi):
    rc, out = runner(FAKE_NVIDIA_SMI_QUERY_GPU=H100)(dynamic_argv(smi, [UUID1]))
    assert rc == 0, out
    rows = parse_dynamic(out)
    assert len(rows) == 1
    assert values(rows[0])["uuid"] == UUID1
    assert set(rows[0]) == set(DYNAMIC_FIELDS)


def test_an_old_driver_is_asked_again_by_the_old_names_and_without_what_it_lacks(smi):
    calls: list = []
    rows = query(runner(calls, FAKE_NVIDIA_SMI_QUERY_GPU=OLD), smi, ["0"])
    # nvidia-smi names the first field it refuses: mig.mode.current (dropped), then a
    # current reason name (all reasons asked again by their old names).
    assert len(calls) == 3
    assert "clocks_event_reasons.active" in calls[0][1] and "mig.mode.current" in calls[0][1]
    assert "mig.mode.current" not in calls[1][1] and "clocks_event_reasons.active" in calls[1][1]
    assert "clocks_throttle_reasons.active" in calls[2][1] and "clocks_event_reasons" not in calls[2][1]
    (row,) = rows
    assert list(row) == list(STATIC_FIELDS)     # keys are always the current names, in order
    assert row["uuid"]["value"] == "GPU-0d4e8b13-92a6-4f7c-b1e5-3a6c8d2f9e04"
    assert row["driver_version"]["value"] == "418.87.01"
    reason = row["clocks_event_reasons.sw_power_cap"]
    assert reason == {"value": False, "source": "nvidia-smi --query-gpu=clocks_throttle_reasons.sw_power_cap"}
    assert row["mig.mode.current"]["value"] is None
    assert "not a field" in row["mig.mode.current"]["error"]
    # What the driver prints in brackets is the reason.
    assert row["ecc.mode.current"] == {"value": None, "source": "nvidia-smi --query-gpu=ecc.mode.current",
                                       "error": "nvidia-smi: N/A"}
    assert row["clocks.applications.graphics"]["error"] == "nvidia-smi: N/A"
    assert row["clocks_event_reasons.hw_thermal_slowdown"]["error"] == "nvidia-smi: Not Supported"
    assert row["clocks.max.sm"]["value"] == 1911


def test_a_current_driver_answers_at_once(smi):
    calls: list = []
    rows = query(runner(calls, FAKE_NVIDIA_SMI_QUERY_GPU=H100), smi, ["1"])
    assert len(calls) == 1
    assert [values(r)["index"] for r in rows] == [1]


def test_the_fake_keeps_its_other_calls(smi):
    # Without a --query-gpu file it still refuses the query (the daemon's bus-id lookup relies on that).
    rc, out = runner()([smi, "--query-gpu=index,pci.bus_id", "--format=csv,noheader"])
    assert rc == 1 and "unsupported" in out
    rc, out = runner(FAKE_NVIDIA_SMI_QUERY_GPU=H100)([smi, "--query-gpu=index,pci.bus_id", "--format=csv,noheader"])
    assert (rc, out) == (0, "0, 00000000:18:00.0\n1, 00000000:2A:00.0\n")
    rc, out = runner(FAKE_NVIDIA_SMI_QUERY_GPU=H100)([smi, "--query-gpu=power.limit", "--format=csv", "-i", "0"])
    assert (rc, out) == (0, "power.limit [W]\n700.00 W\n")


@pytest.mark.parametrize(
    "env, ids, reason",
    [
        ({"FAKE_NVIDIA_SMI_QUERY_GPU": H100}, ["7"], "nvidia-smi exited 6: No devices were found"),
        ({}, ["0"], "nvidia-smi exited 1: fake-nvidia-smi: unsupported arguments"),
    ],
)
def test_a_failed_query_gives_nulls_with_the_reason(smi, env, ids, reason):
    rows = query(runner(**env), smi, ids)
    assert len(rows) == len(ids)
    for f in rows[0].values():
        assert f["value"] is None and f["error"].startswith(reason)


def test_no_nvidia_smi_gives_nulls_with_the_reason(tmp_path):
    rows = query(runner(), str(tmp_path / "nvidia-smi"), ["0", "1"])
    assert len(rows) == 2
    assert rows[1]["uuid"]["error"] == "cannot run %s: No such file or directory" % (tmp_path / "nvidia-smi")


def test_cuda_version_through_the_fake(smi):
    field = cuda_version(runner(FAKE_NVIDIA_SMI_QUERY=SMI / "q-compute-h100.txt"), smi, ["0"])
    assert field == {"value": "12.4", "source": "nvidia-smi -q -d COMPUTE"}
    field = cuda_version(runner(), smi, ["0"])
    assert field["value"] is None and "no -q output given" in field["error"]


def test_cuda_version_from_the_banner_or_missing():
    banner = "| NVIDIA-SMI 550.127.05             Driver Version: 550.127.05     CUDA Version: 12.4     |"
    assert parse_cuda_version(banner)["value"] == "12.4"
    missing = parse_cuda_version("Driver Version : 384.81\n")
    assert missing["value"] is None and "no CUDA Version line" in missing["error"]


# --- parsing edge cases -------------------------------------------------------


def test_retry_fields():
    queried = ["uuid", "mig.mode.current", "clocks_event_reasons.active"]
    assert retry_fields(queried, 'Field "clocks_event_reasons.active" is not a valid field to query.\n') == [
        "uuid", "mig.mode.current", "clocks_throttle_reasons.active"]
    assert retry_fields(queried, 'Field "mig.mode.current" is not a valid field to query.\n') == [
        "uuid", "clocks_event_reasons.active"]
    assert retry_fields(queried, "NVIDIA-SMI has failed because it couldn't communicate with the driver") is None
    assert retry_fields(queried, 'Field "bogus" is not a valid field to query.') is None


def test_malformed_output_is_null_with_a_reason_never_an_exception():
    queried = ["uuid", "temperature.gpu", "clocks_event_reasons.hw_slowdown"]
    rows = parse_query("GPU-a, hot, Maybe\nGPU-b, 40\n\n", queried)
    assert len(rows) == 2
    assert rows[0]["uuid"]["value"] == "GPU-a"
    assert rows[0]["temperature.gpu"]["value"] is None and "unparsable" in rows[0]["temperature.gpu"]["error"]
    assert "neither Active nor Not Active" in rows[0]["clocks_event_reasons.hw_slowdown"]["error"]
    assert all(f["value"] is None and "printed 2 values for 3 fields" in f["error"] for f in rows[1].values())
    assert parse_query("") == []


# --- topology rows (real recordings) ------------------------------------------


def test_topo_rows_from_recordings():
    dgx = topo_rows((GPU / "dgx-a100-topo.txt").read_text(), {0: "GPU-a", 7: "GPU-h"})
    assert set(dgx) == {"GPU-a", "GPU-h"}
    assert dgx["GPU-a"].startswith("GPU1=NV12 GPU2=NV12")
    assert "mlx5_0=PXB" in dgx["GPU-a"] and dgx["GPU-a"].endswith("CPU Affinity=48-63,176-191 NUMA Affinity=3")
    assert "GPU0=" not in dgx["GPU-a"]      # its own X cell
    # The empty cell newer drivers print before "GPU NUMA ID", with and without the terminal's underline.
    for name in ("rtx4090-8-topo.txt", "rtx4090-8-ansi-topo.txt"):
        rtx = topo_rows((GPU / name).read_text(), {1: "GPU-b"})
        assert rtx["GPU-b"].endswith("CPU Affinity=0-55,112-167 NUMA Affinity=0 GPU NUMA ID=N/A"), rtx
    # A copy whose tabs became spaces keeps its words.
    club = topo_rows((GPU / "club3090-5gpu-spaces-topo.txt").read_text(), {2: "GPU-c"})
    assert club["GPU-c"] == "SYS PHB X NODE NODE 0-7,16-23 0 N/A"
    assert topo_rows("garbage", {0: "GPU-a"}) == {}


# --- the section ----------------------------------------------------------------


def collect(smi, end_file, ids):
    """What the shepherd does: static query and CUDA version at start, dynamic query at the end."""
    static = query(runner(FAKE_NVIDIA_SMI_QUERY_GPU=H100), smi, ids)
    cuda = cuda_version(runner(FAKE_NVIDIA_SMI_QUERY=SMI / "q-compute-h100.txt"), smi, ids)
    end = query(runner(FAKE_NVIDIA_SMI_QUERY_GPU=end_file), smi, ids, DYNAMIC_FIELDS)
    return static, cuda, end


def test_section_of_a_two_gpu_job(smi):
    static, cuda, end = collect(smi, H100_HOT, ["0", "1"])
    gpus = section(static, {UUID0: "GPU1=NV18 CPU Affinity=0-47 NUMA Affinity=0"}, list(reversed(end)), cuda)
    json.dumps(gpus)        # a record is JSON
    assert [g["uuid"]["value"] for g in gpus] == [UUID0, UUID1]
    g0 = gpus[0]
    assert g0["driver_version"] == {"value": "550.127.05", "source": "nvidia-smi --query-gpu=driver_version"}
    assert g0["cuda_version"]["value"] == "12.4"
    assert g0["power_limit_w"]["value"] == 700.0 and g0["clocks_max_sm_mhz"]["value"] == 1980
    assert g0["ecc_mode"]["value"] == "Enabled" and g0["mig_mode"]["value"] == "Disabled"
    assert g0["topo"] == {"value": "GPU1=NV18 CPU Affinity=0-47 NUMA Affinity=0", "source": "nvidia-smi topo -m"}
    assert gpus[1]["topo"]["value"] is None and gpus[1]["topo"]["error"] == "no row for this GPU"
    assert set(g0["start"]["clocks_event_reasons"]) == set(REASONS)
    # Start idle and cool; end hot with the hardware slowing it (matched by UUID, not by order).
    assert g0["start"]["temperature_c"]["value"] == 33
    assert g0["start"]["clocks_event_reasons"]["hw_thermal_slowdown"]["value"] is False
    assert g0["end"]["temperature_c"]["value"] == 88
    assert g0["end"]["clocks_event_reasons"]["hw_thermal_slowdown"]["value"] is True
    assert g0["end"]["clocks_event_reasons"]["active"]["value"] == "0x0000000000000048"
    assert gpus[1]["end"]["clocks_event_reasons"]["sw_power_cap"]["value"] is True
    assert gpus[1]["end"]["temperature_c"]["value"] == 71


def test_section_when_the_end_query_failed(smi):
    static, cuda, _ = collect(smi, H100_HOT, ["0"])
    end = unavailable(["0"], "nvidia-smi timed out after 10 s", DYNAMIC_FIELDS)
    (g,) = section(static, {}, end, cuda)
    assert g["uuid"]["value"] == UUID0
    assert g["end"]["temperature_c"] == {"value": None, "source": "nvidia-smi --query-gpu",
                                         "error": "nvidia-smi timed out after 10 s"}
    assert g["end"]["clocks_event_reasons"]["hw_slowdown"]["value"] is None


def test_section_when_nothing_could_be_asked():
    static = unavailable(["0"], "nvidia-smi not found")
    (g,) = section(static, {}, [])
    assert g["uuid"]["error"] == "nvidia-smi not found"
    assert g["cuda_version"]["value"] is None
    assert g["end"]["clocks_event_reasons"]["active"]["error"] == "no end snapshot of this GPU"
    assert all(k in g for k in gpuquery.STATIC_KEYS.values())


# --- the patterns, read without the re module ------------------------------


@pytest.mark.parametrize("text, name", [
    ('Field "mig.mode.current" is not a valid field to query.', "mig.mode.current"),
    ('x Field "" is not a valid field to query; Field "ab" is not a valid field to query', "ab"),
    ('Field "a"b" is not a valid field to query', None),
    ('Field "abc', None),
    ("nothing refused", None),
])
def test_the_refused_field_is_read_as_the_pattern_says(text, name):
    assert invalid_field(text) == name


@pytest.mark.parametrize("text, version", [
    ("CUDA Version: 12.4", "12.4"),
    ("CUDA Version   :   12.4.1 x", "12.4.1"),
    ("CUDA Version: x   CUDA Version: 11.0", "11.0"),
    ("CUDA Version\n:\n9", "9"),
    ("CUDA Version : .5", None),
    ("CUDA Version 12", None),
])
def test_the_cuda_version_is_read_as_the_pattern_says(text, version):
    assert parse_cuda_version(text)["value"] == version


@pytest.mark.parametrize("text, plain", [
    ("\x1b[1;32mGPU0\x1b[0m x", "GPU0 x"),
    ("\x1b[x\x1b[m", "\x1b[x"),
    ("\x1b[12", "\x1b[12"),
    ("a\x1b[;;m b", "a b"),
    ("\x1b[\u0663m", "\x1b[\u0663m"),   # an Arabic-Indic digit is not one of a colour code's
])
def test_colour_codes_are_taken_out(text, plain):
    assert gpuquery._strip_ansi(text) == plain
