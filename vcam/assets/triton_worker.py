"""Serve a Triton model repository written by ``vcam serve export`` with the Triton server that the
``nvidia-pytriton`` wheel bundles (its Python backend only: each model runs in onnxruntime here).

Runs inside the virtual environment ``vcam serve`` makes (numpy < 2, nvidia-pytriton, onnxruntime),
never in vcam's own process: it imports nothing from vcam. Each model's ``config.pbtxt`` gives its
tensors, max batch and dynamic batcher. Prints ``READY`` once every model is bound.

    python triton_worker.py REPO --address 127.0.0.1 --grpc-port 8001 --http-port 8000 --metrics-port 8002
"""

import argparse
import os
import signal
import sys
import threading
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort
from google.protobuf import text_format
from pytriton.decorators import batch
from pytriton.model_config import DynamicBatcher, ModelConfig, Tensor
from pytriton.triton import DEFAULT_PROTECTED_ENDPOINTS, Triton, TritonConfig, TritonSecurityConfig
from tritonclient.grpc import model_config_pb2 as mc

RUNNER_PATH: list = []  # --runner-path's folders
DTYPES = {"TYPE_FP32": np.float32, "TYPE_FP16": np.float16, "TYPE_UINT8": np.uint8, "TYPE_INT64": np.int64}


def runner_for(spec: str, source: str, max_batch: int):
    """``module:function`` (importable here) called with the model's original ONNX file and its max
    batch; returns ``(run(output_names, inputs) -> outputs, description)``. How a benchmark runs a
    batch in its own engine on the GPU (benchmarks/remote_runner.py)."""
    import importlib

    for folder in RUNNER_PATH:  # after this environment's own packages: its numpy < 2 stays first
        if folder and folder not in sys.path:
            sys.path.append(folder)
    module, _, func = spec.partition(":")
    return getattr(importlib.import_module(module), func)(source, max_batch)


def load(mdir: Path, threads: int, source: str = "", runner: str = ""):
    cfg = text_format.Parse((mdir / "config.pbtxt").read_text(), mc.ModelConfig())
    names = [o.name for o in cfg.output]
    out_types = {o.name: DTYPES[mc.DataType.Name(o.data_type)] for o in cfg.output}
    if source and runner:
        run, where = runner_for(runner, source, int(cfg.max_batch_size))
    else:
        opts = ort.SessionOptions()
        opts.log_severity_level = 3
        if threads:
            opts.intra_op_num_threads = threads
        providers = [p for p in ("CUDAExecutionProvider", "CPUExecutionProvider") if p in ort.get_available_providers()]
        sess = ort.InferenceSession(str(mdir / "1" / "model.onnx"), sess_options=opts, providers=providers)
        run, where = sess.run, f"onnxruntime {sess.get_providers()[0]}"

    @batch
    def infer(**inputs):
        outs = run(names, inputs)
        return {n: np.ascontiguousarray(o, dtype=out_types[n]) for n, o in zip(names, outs)}

    def tensors(items):
        return [Tensor(name=t.name, dtype=DTYPES[mc.DataType.Name(t.data_type)], shape=tuple(t.dims)) for t in items]

    db = cfg.dynamic_batching
    batcher = DynamicBatcher(
        max_queue_delay_microseconds=int(db.max_queue_delay_microseconds),
        preferred_batch_size=list(db.preferred_batch_size) or None,
    )
    config = ModelConfig(max_batch_size=int(cfg.max_batch_size), batcher=batcher)
    return cfg.name or mdir.name, infer, tensors(cfg.input), tensors(cfg.output), config, where


def watch_parent(parent: int) -> None:
    """Stop (as Ctrl-C does) once the process that started this one is gone: no orphaned server."""
    while os.getppid() == parent:
        time.sleep(0.5)
    os.kill(os.getpid(), signal.SIGINT)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("repo")
    ap.add_argument("--address", default="127.0.0.1")
    ap.add_argument("--grpc-port", type=int, default=8001)
    ap.add_argument("--http-port", type=int, default=8000)
    ap.add_argument("--metrics-port", type=int, default=8002)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--instances", type=int, default=1)
    ap.add_argument("--tls-cert", default="")
    ap.add_argument("--tls-key", default="")
    ap.add_argument("--tls-ca", default="")
    ap.add_argument("--parent", type=int, default=0)
    ap.add_argument("--runner", default="", metavar="MODULE:FUNCTION", help="runs the models given by --source")
    ap.add_argument("--source", action="append", default=[], metavar="MODEL=ONNX", help="MODEL's original file, for --runner")
    ap.add_argument("--runner-path", default="", help="folders (os.pathsep between) the runner is imported from")
    args = ap.parse_args()
    RUNNER_PATH.extend(args.runner_path.split(os.pathsep))
    if args.parent:
        threading.Thread(target=watch_parent, args=(args.parent,), daemon=True).start()
    repo = Path(args.repo)
    models = sorted(p for p in repo.iterdir() if (p / "config.pbtxt").is_file())
    if not models:
        print(f"error: no model (NAME/config.pbtxt) in {repo}", file=sys.stderr)
        return 2
    tls = {}
    if args.tls_cert:
        tls = dict(grpc_use_ssl=True, grpc_server_cert=args.tls_cert, grpc_server_key=args.tls_key)
        if args.tls_ca:
            tls.update(grpc_use_ssl_mutual=True, grpc_root_cert=args.tls_ca)
    config = TritonConfig(
        grpc_address=args.address,
        grpc_port=args.grpc_port,
        http_address=args.address,
        http_port=args.http_port,
        metrics_address=args.address,
        metrics_port=args.metrics_port,
        allow_metrics=True,
        exit_on_error=True,
        **tls,
    )
    # The statistics (request and execution counts) stay readable: `vcam serve status` and the tests
    # read them; the other admin endpoints keep PyTriton's token.
    security = TritonSecurityConfig(restricted_endpoints=[e for e in DEFAULT_PROTECTED_ENDPOINTS if e != "statistics"])
    with Triton(config=config, security_config=security) as triton:
        sources = dict(item.split("=", 1) for item in args.source)
        for mdir in models:
            src = sources.get(mdir.name, "")
            name, infer, inputs, outputs, mconf, provider = load(mdir, args.threads, src, args.runner)
            funcs = [infer] + [load(mdir, args.threads, src, args.runner)[1] for _ in range(args.instances - 1)]
            triton.bind(model_name=name, infer_func=funcs, inputs=inputs, outputs=outputs, config=mconf, strict=True)
            print(f"model {name}: max batch {mconf.max_batch_size}, {provider}", flush=True)
        triton.run()
        print(f"READY grpc {args.address}:{args.grpc_port} http {args.http_port} metrics {args.metrics_port}", flush=True)
        try:
            triton.serve()
        except KeyboardInterrupt:
            pass
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTRITON_HOME", str(Path.home() / ".cache" / "pytriton"))
    sys.exit(main())
