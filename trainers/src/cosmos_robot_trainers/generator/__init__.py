"""Post-training of Cosmos3 text-to-image / text-to-video generators (docs/generator.md).

- ``generator_sft``: flow-matching SFT on image/video-caption pairs (``sft``);
- ``generator_dpo``: Diffusion-DPO on preference pairs, from a JSONL file or ranked samples (``dpo``);
- ``generator_nft``: DiffusionNFT, groups of deterministic samples per prompt scored by a reward (``nft``).

All three share ``run.GenRun`` (folder, LoRA, optimizer, resume, evaluation, ``final/``, report) and the
losses of ``cosmos_robot_trainers.algorithms`` (``flow_dpo``, ``nft``) that the robot trainers use.
"""
