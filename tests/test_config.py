"""Settings: TOML file, DATAREF_* env vars, safe defaults, and docs that stay honest."""

from __future__ import annotations

from pathlib import Path

import pytest

from dataref.config import load_settings, settings_reference

ROOT = Path(__file__).resolve().parents[1]


def test_defaults_are_safe():
    s = load_settings(state_dir="/tmp/x")
    assert s.kernels.sandbox == "auto"  # a sandbox in every mode auto picks
    assert s.auth.tokens == {}
    assert s.compute.result_max_bytes == 4096
    assert s.compute.stdout_max_bytes == 2048
    assert s.describe.sample_rows == 5
    assert s.server.host == "127.0.0.1"


def test_auto_picks_the_uid_mode_for_root_and_userns_for_anyone_else(monkeypatch):
    from dataref.kernels.sandbox import resolve_mode

    s = load_settings(state_dir="/tmp/x")
    monkeypatch.setattr("os.geteuid", lambda: 0)
    assert resolve_mode(s) == "uid"
    monkeypatch.setattr("os.geteuid", lambda: 1000)
    assert resolve_mode(s) == "userns"
    assert resolve_mode(load_settings(state_dir="/tmp/x", kernels={"sandbox": "bwrap"})) == "uid"
    forced = load_settings(state_dir="/tmp/x", kernels={"sandbox": "unsandboxed"})
    assert resolve_mode(forced) == "unsandboxed"


def test_a_toml_file_and_env_vars_both_configure(tmp_path, monkeypatch):
    cfg = tmp_path / "dataref.toml"
    cfg.write_text(
        'state_dir = "/srv/dataref"\n'
        '[auth]\ntokens = { tok-a = "alice" }\n'
        "[describe]\nsample_rows = 2\n"
        '[sources.crm]\npath = "/data/crm.sqlite"\nsensitive = true\nowners = ["alice"]\n'
    )
    monkeypatch.setenv("DATAREF_DESCRIBE__SAMPLE_ROWS", "3")
    monkeypatch.setenv("DATAREF_KERNELS__MAX_TOTAL", "7")
    s = load_settings(cfg)
    assert s.state_dir == Path("/srv/dataref")
    assert s.auth.tokens == {"tok-a": "alice"}
    assert s.describe.sample_rows == 3  # env beats the file
    assert s.kernels.max_total == 7
    assert s.sources["crm"].sensitive and s.sources["crm"].owners == ["alice"]
    assert set(s.all_sources()) == {"crm", "demo"}


def test_the_config_file_can_come_from_dataref_config(tmp_path, monkeypatch):
    cfg = tmp_path / "c.toml"
    cfg.write_text("[compute]\nresult_max_bytes = 1000\n")
    monkeypatch.setenv("DATAREF_CONFIG", str(cfg))
    monkeypatch.setenv("DATAREF_STATE_DIR", str(tmp_path / "state"))
    s = load_settings()
    assert s.compute.result_max_bytes == 1000
    assert s.state_dir == tmp_path / "state"


def test_unknown_keys_and_bad_values_are_refused(tmp_path):
    cfg = tmp_path / "c.toml"
    cfg.write_text("[compute]\nresult_max_bytez = 1\n")
    with pytest.raises(ValueError):
        load_settings(cfg)
    with pytest.raises(FileNotFoundError):
        load_settings(tmp_path / "missing.toml")


def test_every_setting_has_a_description_and_appears_in_the_readme():
    readme = (ROOT / "README.md").read_text()
    for key, _default, description in settings_reference():
        assert description, f"setting {key} has no description"
        assert f"`{key}`" in readme, f"setting {key} is not documented in README.md"
