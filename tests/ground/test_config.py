from pathlib import Path

import pytest

from vcam import config as C
from vcam import config_file as F
from vcam.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]


def write(tmp_path, text):
    p = tmp_path / "config.toml"
    p.write_text(text)
    return p


def test_shipped_config_documents_every_default():
    cfg = F.load(ROOT / "config.toml")
    assert cfg.replace(source_path="") == C.Config()
    text = (ROOT / "config.toml").read_text()
    documented, table, comment = {}, None, []
    for line in text.splitlines():
        if line.startswith("# [["):  # a list of tables, documented by a commented example
            documented[tuple(line[4:].strip("[]").split("."))] = " ".join(comment)
            comment = []
        elif line.startswith("["):
            table, comment = line.strip("[]"), []
        elif line.startswith("# "):
            comment.append(line[2:])
        elif " = " in line and table:
            documented[(table, line.split(" = ")[0])] = " ".join(comment)
            comment = []
        else:
            comment = []
    for table, key, _default, doc in F.describe():
        assert documented.get((table, key)) == doc, (table, key)  # regenerate: python tools/gen_config_toml.py
    assert max(len(line) for line in text.splitlines()) <= 102


@pytest.mark.parametrize(
    "text,needle",
    [
        ("33ms", 0.033),
        ("0.5s", 0.5),
        ("2", 2.0),
        ("1.5m", 90.0),
        ("250us", 0.00025),
    ],
)
def test_duration_parse(text, needle):
    assert C.Duration.parse(text) == pytest.approx(needle)


def test_cli_overrides_win_over_file(tmp_path):
    p = write(tmp_path, '[pipeline]\nmax_latency = "50ms"\nmax_faces = 3\n')
    cfg = F.load(p, {"pipeline": {"max_latency": "33ms"}})
    assert cfg.pipeline.max_latency == pytest.approx(0.033)
    assert cfg.pipeline.max_faces == 3
    assert cfg.source_path == str(p)


def test_unknown_key_names_file_table_and_nearest(tmp_path):
    p = write(tmp_path, "[pipeline]\nmax_latncy = '33ms'\n")
    with pytest.raises(
        ConfigError, match=r"config\.toml: unknown key 'max_latncy' in \[pipeline\]; did you mean 'max_latency'\?"
    ):
        F.load(p)


def test_unknown_table_suggests(tmp_path):
    p = write(tmp_path, "[captur]\ninput = 'demo'\n")
    with pytest.raises(ConfigError, match=r"unknown table \[captur\]; did you mean 'capture'\?"):
        F.load(p)


def test_wrong_type(tmp_path):
    p = write(tmp_path, "[capture]\nwidth = 'wide'\n")
    with pytest.raises(ConfigError, match=r"\[capture\] width: expected an integer, got 'wide'"):
        F.load(p)


def test_out_of_range(tmp_path):
    p = write(tmp_path, "[pipeline]\nmax_faces = 0\n")
    with pytest.raises(ConfigError, match=r"\[pipeline\] max_faces: expected a value between 1 and 64, got 0"):
        F.load(p)


def test_bad_choice_and_duration(tmp_path):
    with pytest.raises(ConfigError, match=r"\[pipeline\] device: expected one of 'auto', 'cpu', 'cuda', got 'gpu'"):
        F.load(write(tmp_path, "[pipeline]\ndevice = 'gpu'\n"))
    with pytest.raises(ConfigError, match=r"max_latency: expected a duration like '33ms'"):
        F.load(None, {"pipeline": {"max_latency": "fast"}})


def test_invalid_toml_and_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="not valid TOML"):
        F.load(write(tmp_path, "[pipeline\n"))
    with pytest.raises(ConfigError, match="config file not found"):
        F.load(tmp_path / "nope.toml")


def test_user_config_dir_and_env(tmp_path, monkeypatch):
    user = F.default_config_path()
    user.parent.mkdir(parents=True, exist_ok=True)
    user.write_text("[capture]\ninput = 'pattern'\n")
    assert F.load().capture.input == "pattern"
    other = write(tmp_path, "[capture]\ninput = 'demo'\n")
    monkeypatch.setenv("VCAM_CONFIG", str(other))
    assert F.load().capture.input == "demo"


def test_config_is_immutable():
    cfg = C.Config()
    with pytest.raises(Exception):
        cfg.capture.width = 5  # type: ignore[misc]


def test_engines_swapper_table_sets_the_swappers_backend_alone(tmp_path):
    from vcam.runtime.roles import role_backend

    p = tmp_path / "c.toml"
    p.write_text(
        '[pipeline]\nbackend = "onnxruntime"\n[engines.swapper]\nbackend = "remote"\nurl = "grpc://127.0.0.1:8001"\n'
        'timeout = "250ms"\non_fault = "pixelate"\n'
    )
    cfg = F.load(p)
    sw = cfg.engines.swapper
    assert (sw.backend, sw.url, float(sw.timeout), sw.on_fault) == ("remote", "grpc://127.0.0.1:8001", 0.25, "pixelate")
    assert role_backend(cfg, "swapper") == "remote" and role_backend(cfg, "detector") == "onnxruntime"
    assert role_backend(F.load(None), "swapper") == "auto"  # [pipeline] backend as before


@pytest.mark.parametrize(
    "text, needle",
    [
        ('[engines.swaper]\nbackend = "remote"\n', "unknown table [engines.swaper]; did you mean 'swapper'?"),
        ('[engines.swapper]\nbackend = "grpc"\n', "[engines.swapper] backend: expected one of"),
        ('[engines.swapper]\nurll = "x"\n', "unknown key 'urll' in [engines.swapper]; did you mean 'url'?"),
        ("[engines]\nswapper = 3\n", "[engines.swapper] must be a table of keys"),
    ],
)
def test_engines_table_errors_are_one_line(tmp_path, text, needle):
    p = tmp_path / "c.toml"
    p.write_text(text)
    with pytest.raises(ConfigError) as err:
        F.load(p)
    assert needle in str(err.value) and "\n" not in str(err.value)


def test_a_remote_swapper_without_url_is_one_line():
    from vcam.runtime.roles import remote_options

    cfg = F.build({"engines": {"swapper": {"backend": "remote"}}})
    with pytest.raises(ConfigError, match=r"\[engines.swapper\] url is empty"):
        remote_options(cfg, "swapper", "inswapper_128")
    cfg = F.build({"engines": {"swapper": {"backend": "remote", "url": "grpcs://gpu:8001", "token_env": "T"}}})
    with pytest.raises(ConfigError, match="needs a token"):
        remote_options(cfg, "swapper", "inswapper_128")


def test_remote_token_comes_from_its_environment_variable(monkeypatch):
    from vcam.runtime.roles import remote_options

    monkeypatch.setenv("VCAM_REMOTE_TOKEN", "s3cret")
    cfg = F.build({"engines": {"swapper": {"backend": "remote", "url": "grpcs://gpu-box:8001"}}})
    opts = remote_options(cfg, "swapper", "inswapper_128")
    assert opts["token"] == "s3cret" and opts["model"] == "inswapper_128"


def test_status_names_a_remote_server_that_is_down():
    from vcam.state import Status
    from vcam.status import status_suffix

    st = Status(engines=("swapper: remote gpu-box:8001 down since 12:01:03",), guarded={"inswapper_128": 4})
    assert status_suffix(st) == " | swapper: remote gpu-box:8001 down since 12:01:03 | NaN guard: inswapper_128 4"
    assert st.as_dict()["engines"] == ["swapper: remote gpu-box:8001 down since 12:01:03"]


def test_panel_port_default_from_the_environment(tmp_path, monkeypatch):
    """$VCAM_PANEL_PORT replaces the panel port's default (the tests' isolation sets 0); a file or a
    flag still wins, and a value that is not a port is one line."""
    assert C.Config().panel.port == 8765
    monkeypatch.setenv("VCAM_PANEL_PORT", "0")
    assert F.load().panel.port == 0
    cfg = tmp_path / "c.toml"
    cfg.write_text("[panel]\nport = 9001\n")
    assert F.load(cfg).panel.port == 9001
    assert F.load(cfg, {"panel": {"port": 9002}}).panel.port == 9002
    monkeypatch.setenv("VCAM_PANEL_PORT", "soon")
    with pytest.raises(ConfigError, match=r"\$VCAM_PANEL_PORT: expected a port number, got 'soon'"):
        F.load()
    monkeypatch.setenv("VCAM_PANEL_PORT", "70000")
    with pytest.raises(ConfigError, match=r"\$VCAM_PANEL_PORT"):
        F.load()


def test_obs_audio_sync_is_a_list_of_input_names(tmp_path):
    p = tmp_path / "c.toml"
    p.write_text('[obs]\naudio_sync = ["Mic/Aux", "Desktop Mic", "Mic/Aux"]\n')
    assert F.load(p).obs.audio_sync == ["Mic/Aux", "Desktop Mic"]  # a name given twice counts once
    assert C.Config().obs.audio_sync == []
    for bad in ("[1]", '[""]'):
        p.write_text(f"[obs]\naudio_sync = {bad}\n")
        with pytest.raises(ConfigError, match=r'\[obs\] audio_sync: expected a list of names like \["Mic/Aux"\]'):
            F.load(p)
