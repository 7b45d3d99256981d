"""Cosmos3 as a text-to-image / text-to-video generator, and what post-training it needs offline.

- ``cosmos3``: ``Cosmos3Generator``: the training forward (equal to the pipeline's velocity), VAE codec,
  deterministic sampler;
- ``shapes``: procedurally drawn, captioned scenes (training data and prompts);
- ``tiny``: a tiny pipeline whose VAE is pretrained on shapes (tests, CPU recipes);
- ``rewards``: JPEG compressibility, brightness, colour match, and an HTTP reward-service client/server.
"""
