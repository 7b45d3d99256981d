"""The ``cosmos3`` family: Cosmos3 action policies through diffusers' ``Cosmos3OmniTransformer``.

- ``sampler``: our denoising loop (state row, one encoded frame, guidance interval, flow UniPC);
- ``conventions``: cosmos-framework's DROID and LIBERO conventions (images, state, actions);
- ``policy``: ``Cosmos3Policy``, the ``BatchPolicy`` the server calls;
- ``tiny``: tiny random pipelines in diffusers' folder format for tests.
"""
