"""`rlctl tinker`'s refusals, before anything loads (in-process, fast)."""

from __future__ import annotations

from support.cli import rlctl_here


def test_cpus_without_address_is_refused(tiny_model_dir):
    r = rlctl_here("tinker", "--model", str(tiny_model_dir), "--cpus", "2")
    assert r.returncode == 2 and "--cpus applies only with --address" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_a_key_the_sdk_would_refuse_is_refused(tiny_model_dir):
    r = rlctl_here("tinker", "--model", str(tiny_model_dir), "--api-key", "secret")
    assert r.returncode == 2 and "must start with 'tml-'" in r.stderr


def test_exposing_the_server_needs_a_key(tiny_model_dir):
    r = rlctl_here("tinker", "--model", str(tiny_model_dir), "--host", "0.0.0.0")
    assert r.returncode == 2 and "without an API key" in r.stderr


def test_a_missing_model_folder_is_a_data_error(tmp_path):
    r = rlctl_here("tinker", "--model", str(tmp_path / "nope"))
    assert r.returncode == 3 and "--model" in r.stderr and "is not a folder" in r.stderr
