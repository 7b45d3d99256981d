"""Text post-training on the shared trainer core: conversation SFT (``text_sft``) of HF causal LMs."""
