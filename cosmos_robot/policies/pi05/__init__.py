"""The ``pi05`` family: LeRobot pi0.5 checkpoint folders served by a native model.

- ``modeling``: ``Pi05Model`` (SigLIP + Gemma VLM + Gemma action expert, LeRobot's parameter names,
  prefix KV cache, fused attention) and ``Pi05Architecture`` (sizes);
- ``checkpoint``: reading, checking and writing LeRobot's folder (config, weights, processors);
- ``policy``: ``Pi05Policy``, the ``BatchPolicy`` the server and the eval runner call;
- ``tokenizer``: a byte-level stand-in tokenizer for tiny offline models (PaliGemma's is gated).
"""
