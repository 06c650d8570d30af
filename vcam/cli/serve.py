"""`vcam serve`: the swap served to other machines over KServe V2 (see README, 'Serve the swap from
another machine'). ``vcam serve export DIR`` writes a Triton model repository; ``vcam serve`` runs
the Triton server bundled in the nvidia-pytriton wheel on one (its own environment, made once)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Optional

import typer

from vcam.cli.common import ConfigOpt, app, fail, load_config, out

serve_app = typer.Typer(
    rich_markup_mode="rich",
    invoke_without_command=True,
    help="Serve the swap to other machines: run Triton (PyTriton's bundled server) or export a model repository.",
)
app.add_typer(serve_app, name="serve", help="Serve the swap to other machines (Triton, KServe V2 over gRPC).")

_MODELS = typer.Option(["inswapper_128"], "--model", help="Registry model to serve (repeatable).")
_FP16 = typer.Option(False, "--fp16", help="FP16 inputs and outputs on the wire (TensorRT FP16 on a Triton GPU).")
_UINT8 = typer.Option(False, "--uint8-input", help="Image inputs as uint8 pixels (a cast in the model): a quarter of FP32.")
_BATCH = typer.Option(8, "--max-batch", min=1, max=256, help="Largest batch the server's dynamic batcher forms.")
_DELAY = typer.Option(100, "--queue-delay-us", min=0, help="How long the batcher waits for more requests (microseconds).")


def _export(
    cfg, out_dir: Path, models: list[str], fp16: bool, uint8: bool, max_batch: int, delay: int, gpu: bool, originals: dict
) -> list:
    """Export ``models``; ``originals`` gets each one's own ONNX file."""
    from vcam.models.serving import export_repository
    from vcam.runtime.roles import model_store

    store = model_store(cfg)
    paths = store.ensure(models)
    originals.update({name: str(paths[name]) for name in models})
    return [
        export_repository(
            out_dir, name, paths[name], fp16=fp16, uint8_input=uint8, max_batch=max_batch, queue_delay_us=delay, gpu=gpu
        )
        for name in models
    ]


@serve_app.command("export")
def serve_export(
    out_dir: Path = typer.Argument(..., help="Folder to write the Triton model repository to."),
    models: list[str] = _MODELS,
    fp16: bool = _FP16,
    uint8_input: bool = _UINT8,
    max_batch: int = _BATCH,
    queue_delay_us: int = _DELAY,
    cpu: bool = typer.Option(False, "--cpu", help="Instance group on the CPU (default: the server's GPUs)."),
    config: Optional[Path] = ConfigOpt,
) -> None:
    """Write a Triton model repository (ONNX with a dynamic batch, config.pbtxt with the dynamic
    batcher) plus a KServe InferenceService manifest; prints the `docker run` line for Triton."""
    from vcam.errors import VcamError
    from vcam.models.serving import docker_line

    cfg = load_config(config)
    try:
        done = _export(cfg, out_dir, models, fp16, uint8_input, max_batch, queue_delay_us, not cpu, {})
    except VcamError as exc:
        fail(exc)
    for e in done:
        out.print(f"wrote {e.model} and {e.config}", highlight=False, soft_wrap=True)
    out.print(f"wrote {done[0].manifest} (KServe InferenceService)", highlight=False, soft_wrap=True)
    out.print(
        f"serve it with NVIDIA's Triton container:\n  {docker_line(out_dir)}", highlight=False, markup=False, soft_wrap=True
    )


@serve_app.command("setup")
def serve_setup() -> None:
    """Make the serving environment (nvidia-pytriton, numpy < 2, onnxruntime) now; `vcam serve` makes it on first use."""
    from vcam.errors import VcamError
    from vcam.runtime.serve import ensure_env

    try:
        py, libdir = ensure_env(quiet=False)
    except VcamError as exc:
        fail(exc)
    out.print(f"serving environment: {py} (libpython in {libdir})", highlight=False, soft_wrap=True)


@serve_app.callback()
def serve(
    ctx: typer.Context,
    repo: Optional[Path] = typer.Option(None, "--repo", help="Serve this repository (from `vcam serve export`) instead."),
    models: list[str] = _MODELS,
    fp16: bool = _FP16,
    uint8_input: bool = _UINT8,
    max_batch: int = _BATCH,
    queue_delay_us: int = _DELAY,
    host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on (another host's clients need TLS)."),
    port: int = typer.Option(8001, "--port", help="gRPC port (KServe V2)."),
    http_port: int = typer.Option(8000, "--http-port", help="HTTP port: /v2/health/ready and the V2 REST API."),
    metrics_port: int = typer.Option(8002, "--metrics-port", help="Prometheus metrics port (/metrics)."),
    instances: int = typer.Option(1, "--instances", min=1, help="Model instances (each its own onnxruntime session)."),
    threads: int = typer.Option(0, "--threads", min=0, help="onnxruntime threads per instance (0: its default)."),
    tls_cert: str = typer.Option("", "--tls-cert", help="Server certificate (PEM): gRPC over TLS."),
    tls_key: str = typer.Option("", "--tls-key", help="Its private key (PEM)."),
    tls_ca: str = typer.Option("", "--tls-ca", help="CA (PEM) that client certificates must chain to (mutual TLS)."),
    log_file: Optional[Path] = typer.Option(None, "--log", help="Append the server's output to this file."),
    server_kind: str = typer.Option(
        "python-backend",
        "--server",
        help="python-backend: the bundled tritonserver directly, each model in Triton's own Python backend; "
        "pytriton: PyTriton's Triton (a proxy hop to a second Python process per request).",
    ),
    engine: str = typer.Option(
        "auto",
        "--engine",
        help="What runs each batch in the server. onnxruntime: the serving environment's (CUDA where that build has it); "
        "vcam: vcam's own PyTorch engine (FP16 on the GPU torch sees, else the CPU); auto: vcam where torch sees a GPU "
        "here (not with --repo), else onnxruntime.",
    ),
    config: Optional[Path] = ConfigOpt,
) -> None:
    """Run the Triton server bundled in the nvidia-pytriton wheel (in its own environment, made on
    first use) serving MODEL with the dynamic batcher, health/ready endpoints and metrics."""
    if ctx.invoked_subcommand:
        return
    from vcam.errors import VcamError
    from vcam.platform import folders
    from vcam.runtime.serve import TritonServer, runner_for

    _check(server_kind, engine, host, bool(tls_cert and tls_key))
    cfg = load_config(config)
    try:
        originals: dict[str, str] = {}
        if repo is None:
            repo = folders.cache_dir() / "serve-repo"
            _export(cfg, repo, models, fp16, uint8_input, max_batch, queue_delay_us, False, originals)
        runner = runner_for(engine, repo, originals)
        tls = (tls_cert, tls_key, tls_ca) if tls_cert else None
        server = TritonServer(
            repo, address=host, grpc_port=port, http_port=http_port, metrics_port=metrics_port,
            threads=threads, instances=instances, tls=tls, log=log_file, server=server_kind, runner=runner,
        )  # fmt: skip
        server.wait_ready()
    except VcamError as exc:
        fail(exc)
    scheme = "grpcs" if tls_cert else "grpc"
    what = f"{server_kind}, {'vcam engine' if runner else 'onnxruntime'}"
    _announce(f"{repo}", f"{scheme}://{host}:{port}", what, f"http://{host}:{http_port}", f"http://{host}:{metrics_port}")
    try:
        while server.proc.poll() is None:
            time.sleep(0.5)
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()
    if server.proc.returncode not in (0, -15, None):
        tail = [ln for ln in server.lines if ln.strip()][-1:] or [""]
        fail(VcamError(f"the Triton server stopped ({server.proc.returncode}): {tail[0][:200]}"))


def _check(server_kind: str, engine: str, host: str, tls: bool) -> None:
    """One line and exit 2 for a server kind or engine not known, or another host without TLS."""
    import ipaddress

    from vcam.errors import ConfigError
    from vcam.runtime.serve import ENGINES, SERVERS

    if server_kind not in SERVERS:
        fail(ConfigError(f"--server {server_kind!r} is not a server kind", hint=f"choose one of {', '.join(SERVERS)}"))
    if engine not in ENGINES:
        fail(ConfigError(f"--engine {engine!r} is not an engine", hint=f"choose one of {', '.join(ENGINES)}"))
    try:
        loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    if not loopback and not tls:
        fail(
            ConfigError(
                f"serving on {host} needs --tls-cert and --tls-key (faces are biometric data)", hint="or --host 127.0.0.1"
            )
        )


def _announce(repo: str, url: str, what: str, http: str, metrics: str) -> None:
    out.print(f"serving {repo} on {url} ({what})", highlight=False, soft_wrap=True)
    out.print(f"  ready: {http}/v2/health/ready  metrics: {metrics}/metrics", highlight=False, soft_wrap=True)
    out.print(
        f'  clients: [engines.swapper] backend = "remote", url = "{url}"  (Ctrl-C stops)',
        highlight=False,
        markup=False,
        soft_wrap=True,
    )
