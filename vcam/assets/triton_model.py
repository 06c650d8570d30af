"""A model of Triton's own Python backend (``NAME/1/model.py``), written by ``vcam serve`` into the
repository it serves with the ``tritonserver`` binary directly (``--server python-backend``).

Runs in the backend's stub process, inside the serving environment (numpy < 2, onnxruntime): it
imports nothing from vcam. Each execution takes every request the dynamic batcher gathered, runs
them as one batch and splits the rows back per request. The model is ``NAME/1/model.onnx`` in
onnxruntime (CUDA where that build of onnxruntime has it), or, when the config's parameters name a
``runner`` (``module:function``, importable from ``runner_path``'s folders), what that callable returns for the
``source`` file: ``run(output_names, inputs) -> outputs`` and a description (how a benchmark runs
vcam's own engine on the GPU, or a model that computes nothing).
"""

import importlib
import json
import os
import sys

import numpy as np
import triton_python_backend_utils as pb_utils


def _params(config):
    return {k: v.get("string_value", "") for k, v in config.get("parameters", {}).items()}


def _onnxruntime(path, threads):
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    if threads:
        opts.intra_op_num_threads = threads
    have = ort.get_available_providers()
    providers = [p for p in ("CUDAExecutionProvider", "CPUExecutionProvider") if p in have]
    sess = ort.InferenceSession(path, sess_options=opts, providers=providers)
    return sess.run, f"onnxruntime {sess.get_providers()[0]}"


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        params = _params(config)
        self.inputs = [t["name"] for t in config["input"]]
        self.outputs = [t["name"] for t in config["output"]]
        self.types = {t["name"]: pb_utils.triton_string_to_numpy(t["data_type"]) for t in config["output"]}
        here = os.path.join(args["model_repository"], args["model_version"])
        runner = params.get("runner", "")
        if runner:
            # The stub's interpreter does not read PYTHONPATH: the runner's folders come as a parameter,
            # after this environment's own packages (its numpy < 2 stays first).
            for folder in params.get("runner_path", "").split(os.pathsep):
                if folder and folder not in sys.path:
                    sys.path.append(folder)
            module, _, func = runner.partition(":")
            make = getattr(importlib.import_module(module), func)
            self.run, where = make(params.get("source", ""), int(config.get("max_batch_size", 0)))
        else:
            self.run, where = _onnxruntime(os.path.join(here, "model.onnx"), int(params.get("threads", "0") or 0))
        print(f"model {config['name']}: max batch {config.get('max_batch_size', 0)}, {where}", file=sys.stderr, flush=True)

    def execute(self, requests):
        feeds = {}
        sizes = []
        for name in self.inputs:
            parts = [pb_utils.get_input_tensor_by_name(r, name).as_numpy() for r in requests]
            feeds[name] = parts[0] if len(parts) == 1 else np.concatenate(parts)
            sizes = [len(p) for p in parts]
        try:
            outs = self.run(self.outputs, feeds)
        except Exception as exc:  # every request of the batch gets the error; the model stays up
            err = pb_utils.TritonError(f"{type(exc).__name__}: {exc}")
            return [pb_utils.InferenceResponse(output_tensors=[], error=err) for _ in requests]
        outs = [np.ascontiguousarray(o, dtype=self.types[n]) for n, o in zip(self.outputs, outs)]
        replies, start = [], 0
        for rows in sizes:
            tensors = [pb_utils.Tensor(n, o[start : start + rows]) for n, o in zip(self.outputs, outs)]
            replies.append(pb_utils.InferenceResponse(output_tensors=tensors))
            start += rows
        return replies
