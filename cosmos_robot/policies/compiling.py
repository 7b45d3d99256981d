"""``torch.compile`` for served models, one repeated block at a time.

Why per block: a transformer's layers are instances of one class with the same shapes, so they
share one compiled graph; compiling them one by one costs one layer's compile time, not the whole
model's, and keeps the model's own Python (data-dependent masks, list inputs) outside the compiled
region. Used by the cosmos3 and groot loaders' ``compile`` option.
"""

from __future__ import annotations

import torch

__all__ = ["compile_blocks", "transformer_blocks"]


def transformer_blocks(module: torch.nn.Module) -> list[torch.nn.Module]:
    """The module's longest ``ModuleList`` (its stack of layers), or the module itself when it has none."""
    best: list[torch.nn.Module] = [module]
    for m in module.modules():
        if isinstance(m, torch.nn.ModuleList) and len(m) > 1 and (best[0] is module or len(m) > len(best)):
            best = list(m)
    return best


def compile_blocks(module: torch.nn.Module, every_stack: bool = False, backend: str = "inductor") -> int:
    """Compile the blocks of the longest stack (``every_stack``: of every ``ModuleList`` of 2 or more
    blocks, for models made of several towers); returns how many blocks were compiled. ``backend``:
    torch.compile's (``"eager"``: Dynamo's tracing and guards without code generation)."""
    stacks = (
        [list(m) for m in module.modules() if isinstance(m, torch.nn.ModuleList) and len(m) > 1]
        if every_stack
        else [transformer_blocks(module)]
    )
    count = 0
    for stack in stacks:
        for block in stack:
            block.compile(backend=backend)
            count += 1
    return count
