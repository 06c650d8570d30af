"""Native PyTorch modules for the architectures we ship or expect (needs PyTorch).

The inswapper generator and the embedded RetinaFace mobilenet0.25 are rebuilt as PyTorch modules and
filled from the ONNX file's initializers (:mod:`.weights` checks every shape), which is faster and
more robust than converting their graphs op by op.
"""
