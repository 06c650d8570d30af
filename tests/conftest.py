"""Shared test helpers.

``require(component, reason)``: skip a test whose component is missing here, or fail it when the
environment variable VCAM_REQUIRE (comma list, set by .ci/run) names that component, so a skip in CI
can never hide a missing install step.
"""

import os

import pytest


def require(component, reason):
    req = {s.strip() for s in os.environ.get("VCAM_REQUIRE", "").split(",") if s.strip()}
    (pytest.fail if component in req else pytest.skip)(f"{component} unavailable: {reason}")


@pytest.fixture(autouse=True)
def _isolated_user_dirs(tmp_path_factory, monkeypatch):
    """Keep every test away from the real user's config, face bank and model dirs."""
    home = tmp_path_factory.mktemp("home")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(home / "config"))
    monkeypatch.setenv("XDG_DATA_HOME", str(home / "data"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(home / "cache"))
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(home / "run"))
    (home / "run").mkdir(mode=0o700)
    monkeypatch.delenv("VCAM_CONFIG", raising=False)
    yield
